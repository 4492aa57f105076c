"""hydra-submitit-launcher's SLURM launcher, with a submission that SLURM refuses (a partition,
account or resource it does not have), and a job that ended without a result (cancelled),
told in one line instead of a traceback."""

import contextlib
import io
import logging
import os
import subprocess
import sys
from collections.abc import Sequence

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher import submitit_launcher

log = logging.getLogger(__name__)


class SlurmLauncher(submitit_launcher.SlurmLauncher):
    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from submitit.core.utils import FailedJobError, UncompletedJobError

        # submitit prints sbatch's complaint before raising it: held here, told once below.
        held = io.StringIO()
        try:
            with contextlib.redirect_stderr(held):
                return super().launch(job_overrides, initial_job_idx)
        except FailedJobError as error:
            # Raised for a job that failed too; sbatch's refusal carries its exit status.
            refused = isinstance(error.__cause__, subprocess.CalledProcessError)
            if not refused or os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            held = io.StringIO()
            said = "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
            log.error(
                "SLURM refused the jobs: %s. Check hydra.launcher (configs/hydra/launcher/"
                "slurm.yaml) against your cluster: `sinfo` lists its partitions and resources.",
                said,
            )
            sys.exit(1)
        except UncompletedJobError as error:  # cancelled, or killed: it wrote no result
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            job, state = str(error).splitlines()[:2]
            log.error(
                "SLURM %s %s. Its run folder in %s says how far it got (job.yaml, checkpoints/ and "
                "hpc_ckpt_*.ckpt: resume with `python train.py ckpt_path=<checkpoint>`).",
                job.split(" with path")[0], state, self.config.hydra.sweep.dir,
            )  # fmt: skip
            sys.exit(1)
        finally:
            sys.stderr.write(held.getvalue())

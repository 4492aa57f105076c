"""Language models: the nets, the LightningModule, sampling from checkpoints, the experiment."""

import functools
import math
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import hydra
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import OmegaConf, open_dict
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.flop_counter import FlopCounterMode

from kindling import cli
from kindling import sample as sample_cli
from kindling.data.text import CharTextDataModule, Vocabulary
from kindling.errors import UserError
from kindling.loading import load_module
from kindling.models.language_models import (
    GRULanguageModel,
    LSTMLanguageModel,
    RNNLanguageModel,
    TransformerLanguageModel,
)
from kindling.modules.language_model import LanguageModel
from kindling.train import run

from helpers import (
    PYTHON,
    QUIET,
    TINY_CORPUS,
    error_lines,
    quiet_trainer,
    read_metrics,
    tiny_experiment,
    train_py,
)

FAMILIES = ["rnn", "lstm", "transformer"]


def tiny_net(family: str, vocab_size: int = 30) -> torch.nn.Module:
    if family == "transformer":
        return TransformerLanguageModel(vocab_size, 16, d_model=32, num_layers=2, num_heads=4)
    cls = {"rnn": RNNLanguageModel, "lstm": LSTMLanguageModel, "gru": GRULanguageModel}[family]
    return cls(vocab_size, embedding_dim=16, hidden_size=32, num_layers=2)


def net_factory(family: str, **kwargs) -> functools.partial:
    if family == "transformer":
        return functools.partial(TransformerLanguageModel, **kwargs)
    return functools.partial({"rnn": RNNLanguageModel, "lstm": LSTMLanguageModel}[family], **kwargs)


def unigram_entropy(text: str) -> float:
    """Entropy in nats of the character frequencies: the loss of a model that ignores context."""
    counts = Counter(text)
    return -sum(n / len(text) * math.log(n / len(text)) for n in counts.values())


# --------------------------------------------------------------------------------------------
# The nets


@pytest.mark.parametrize("family", ["rnn", "lstm", "gru", "transformer"])
def test_ids_in_logits_out(family: str) -> None:
    logits = tiny_net(family, vocab_size=30)(torch.randint(0, 30, (3, 16)))
    assert logits.shape == (3, 16, 30)


@pytest.mark.parametrize("family", ["rnn", "lstm", "gru", "transformer"])
def test_step_by_step_equals_the_whole_window(family: str) -> None:
    """Sampling feeds one token at a time with a state; it must see what training sees."""
    net = tiny_net(family).eval()
    tokens = torch.randint(0, 30, (2, 16))
    whole = net(tokens)
    logits, state = net.forward_with_state(tokens[:, :5])
    steps = [logits]
    for t in range(5, 16):
        logits, state = net.forward_with_state(tokens[:, t : t + 1], state)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=1e-4, atol=1e-5)


def test_transformer_is_causal() -> None:
    net = tiny_net("transformer").eval()
    tokens = torch.randint(0, 30, (1, 16))
    changed = tokens.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 30
    torch.testing.assert_close(net(tokens)[:, :10], net(changed)[:, :10])
    assert not torch.allclose(net(tokens)[:, 10:], net(changed)[:, 10:])


def test_transformer_ties_its_head_to_the_token_embedding() -> None:
    net = tiny_net("transformer")
    assert net.head.weight is net.token_embedding.weight
    assert net.num_parameters() == sum(p.numel() for p in net.parameters()) - 16 * 32


def test_transformer_rejects_windows_longer_than_its_context() -> None:
    with pytest.raises(ValueError, match="context_length"):
        tiny_net("transformer")(torch.zeros(1, 17, dtype=torch.long))


def test_transformer_keeps_sampling_past_its_context() -> None:
    net = tiny_net("transformer").eval()
    _logits, state = net.forward_with_state(torch.zeros(1, 40, dtype=torch.long))
    assert state.shape == (1, 15)  # room for one more token in a context of 16
    logits, state = net.forward_with_state(torch.ones(1, 1, dtype=torch.long), state)
    assert logits.shape == (1, 1, 30) and state.shape == (1, 15)


def test_training_flops_match_a_flop_counter() -> None:
    net = TransformerLanguageModel(50, context_length=32, d_model=64, num_layers=2, num_heads=4)
    tokens = torch.randint(0, 50, (3, 32))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(net(tokens).flatten(0, 1), tokens.flatten()).backward()
    assert net.training_flops(3, 32) == pytest.approx(counter.get_total_flops(), rel=0.02)


def test_documented_gpu_transformer_has_about_100m_parameters() -> None:
    # Built on the meta device: shapes only, no memory, no time.
    with torch.device("meta"):
        net = TransformerLanguageModel(
            vocab_size=100, context_length=1024, d_model=768, num_layers=12, num_heads=12
        )
    assert 80e6 < net.num_parameters() < 110e6


# --------------------------------------------------------------------------------------------
# The LightningModule


def make_module(family: str, **kwargs) -> LanguageModel:
    sizes = {"d_model": 32, "num_layers": 2, "num_heads": 4, "context_length": 16}
    if family != "transformer":
        sizes = {"embedding_dim": 16, "hidden_size": 64, "num_layers": 1}
    return LanguageModel(
        net=net_factory(family, dropout=0.0, **sizes),
        optimizer=functools.partial(torch.optim.AdamW, lr=kwargs.pop("lr", 0.01)),
        **kwargs,
    )


def fit(
    module: LanguageModel,
    datamodule: CharTextDataModule,
    root: Path,
    epochs: int,
    logger=False,
    **settings: object,
) -> None:
    trainer = quiet_trainer(
        max_epochs=epochs, logger=logger, default_root_dir=str(root), **settings
    )
    trainer.fit(module, datamodule=datamodule)


def tiny_data(tmp_path: Path, **kwargs) -> CharTextDataModule:
    path = tmp_path / "tiny.txt"
    path.write_text(TINY_CORPUS, encoding="utf-8")
    settings = {"context_length": 16, "batch_size": 8, "val_fraction": 0.1, "test_fraction": 0.1}
    return CharTextDataModule(str(tmp_path), path=str(path), **{**settings, **kwargs})


@torch.no_grad()
def mean_loss(module: LanguageModel, loader) -> float:
    module.eval()
    losses = [F.cross_entropy(module(x).flatten(0, 1), y.flatten()) for x, y in loader]
    return float(torch.stack(losses).mean())


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_memorises_a_tiny_corpus(tmp_path: Path, family: str) -> None:
    """Through the real Trainer: the training text's loss ends far below its unigram entropy."""
    torch.manual_seed(0)
    # The same windows every epoch: memorising them is the point, not reading at any offset.
    datamodule = tiny_data(tmp_path, random_offsets=False)
    module = make_module(family, lr=0.01, sample_length=0)
    # 60 epochs of 3 steps (at 40 the transformer can stop short of 0.15 of the entropy). Nothing
    # validated: only the training text's loss is measured.
    fit(module, datamodule, tmp_path, epochs=60, limit_val_batches=0, num_sanity_val_steps=0)
    train_text = datamodule.vocabulary.decode(datamodule.data_train.tokens)
    entropy = unigram_entropy(train_text)  # about 2.9 nats
    assert mean_loss(module, datamodule.train_dataloader()) < 0.15 * entropy


def test_net_is_built_for_the_data_vocabulary_and_samples_are_recorded(tmp_path: Path) -> None:
    datamodule = tiny_data(tmp_path)
    module = make_module("lstm", sample_length=30, sample_prompt="S")
    fit(module, datamodule, tmp_path, epochs=1, logger=TensorBoardLogger(tmp_path / "tb"))
    assert module.vocabulary == Vocabulary(TINY_CORPUS)
    assert module.net.head.out_features == len(set(TINY_CORPUS))
    samples = (tmp_path / "samples.txt").read_text(encoding="utf-8")
    # One sample before training (the sanity check) and one after the epoch.
    assert samples.count("=== Sample at step") == 2
    assert "(before training)" in samples and "(epoch 0)" in samples
    assert "\nS" in samples
    events = EventAccumulator(str(tmp_path / "tb" / "lightning_logs" / "version_0"))
    events.Reload()
    assert "samples/text_summary" in events.Tags()["tensors"]


def test_generate_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    module = make_module("transformer")
    module.build(Vocabulary(TINY_CORPUS))
    prompt = torch.tensor([[1, 2, 3]])

    def generate(seed: int, **kwargs) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return module.generate(prompt, 50, generator=generator, **kwargs)

    assert torch.equal(generate(0), generate(0))
    assert not torch.equal(generate(0), generate(1))
    assert generate(0).shape == (1, 50)
    # top_k=1 and temperature 0 both take the most likely id: the seed no longer matters.
    assert torch.equal(generate(0, top_k=1), generate(1, temperature=0.0))
    assert module.training  # generate leaves the module as it found it


def test_top_k_samples_only_among_the_k_most_likely(tmp_path: Path) -> None:
    module = make_module("lstm")
    module.build(Vocabulary(TINY_CORPUS))
    module.eval()
    prompt = torch.tensor([[5]])
    allowed = set(module(prompt)[0, -1].topk(3).indices.tolist())
    firsts = {
        int(module.generate(prompt, 1, top_k=3, generator=torch.Generator().manual_seed(s))[0, 0])
        for s in range(50)
    }
    assert firsts <= allowed and len(firsts) > 1


def test_prompts_outside_the_vocabulary_are_user_errors() -> None:
    module = make_module("lstm")
    module.build(Vocabulary("abc \n"))
    with pytest.raises(UserError, match="not in the vocabulary"):
        module.sample("abz", 10)
    with pytest.raises(UserError, match="prompt is empty"):
        module.sample("", 10)


def test_a_checkpoint_of_another_vocabulary_is_a_user_error() -> None:
    trained = make_module("lstm")
    trained.build(Vocabulary("abc"))
    resumed = make_module("lstm")
    resumed.build(Vocabulary("abd"))
    with pytest.raises(UserError, match="vocabulary"):
        resumed.load_state_dict(trained.state_dict())


# --------------------------------------------------------------------------------------------
# The experiment: config selection, a run, sampling from its checkpoint


@pytest.mark.parametrize("family", FAMILIES)
def test_experiment_selects_the_language_model_of_the_family(compose_config, family) -> None:
    cfg = compose_config("experiment=charlm", f"model=lm/{family}")
    expected = {"rnn": "RNN", "lstm": "LSTM", "transformer": "Transformer"}[family]
    assert cfg.model._target_ == "kindling.modules.language_model.LanguageModel"
    assert cfg.model.net._target_ == f"kindling.models.language_models.{expected}LanguageModel"
    assert cfg.data._target_ == "kindling.data.text.CharTextDataModule"
    assert cfg.callbacks.model_checkpoint.monitor == "val/loss"
    assert cfg.callbacks.model_checkpoint.mode == "min"
    assert cfg.optimized_metric == "val/loss"


def test_without_the_experiment_model_is_still_the_classifier(compose_config) -> None:
    cfg = compose_config("model=lstm")
    assert cfg.model._target_ == "kindling.modules.classifier.Classifier"
    assert cfg.model.net._target_ == "kindling.models.recurrent.LSTMClassifier"


def test_an_image_classifier_on_text_stops_at_its_class_count(compose_config) -> None:
    cfg = compose_config("experiment=charlm", "model=lstm")
    with pytest.raises(Exception, match=r"data\.num_classes"):
        OmegaConf.to_container(cfg, resolve=True)


def test_experiment_defaults_to_the_transformer(compose_config) -> None:
    cfg = compose_config("experiment=charlm")
    assert cfg.model.net._target_ == "kindling.models.language_models.TransformerLanguageModel"
    assert cfg.model.net.context_length == cfg.data.context_length


@pytest.mark.parametrize("family", FAMILIES)
def test_model_keys_reach_the_language_model(compose_config, family, tmp_path) -> None:
    """`model.<key>=` means the same in every task: the learning rate the optimizer gets."""
    corpus = tmp_path / "tiny.txt"
    corpus.write_text(TINY_CORPUS, encoding="utf-8")
    cfg = compose_config(
        *tiny_experiment(family, corpus), "model.optimizer.lr=0.0123", "model.net.num_layers=2"
    )
    datamodule = hydra.utils.instantiate(cfg.data)
    module = hydra.utils.instantiate(cfg.model)
    datamodule.setup("fit")
    module.build(datamodule.vocabulary)
    optimizer = module.optimizer_factory(params=module.parameters())
    assert optimizer.param_groups[0]["lr"] == 0.0123
    num_layers = len(module.net.blocks) if family == "transformer" else module.net.rnn.num_layers
    assert num_layers == 2


@pytest.mark.parametrize("family", FAMILIES)
def test_experiment_runs_logs_and_checkpoints(compose_config, tmp_path, family) -> None:
    corpus = tmp_path / "tiny.txt"
    corpus.write_text(TINY_CORPUS, encoding="utf-8")
    value = run(compose_config(*tiny_experiment(family, corpus)))
    run_dir = tmp_path / "run"
    rows = read_metrics(run_dir)
    logged = {name for row in rows for name, v in row.items() if v}
    assert {"train/loss", "val/loss", "val/ppl", "test/loss", "test/ppl"} <= logged
    val = [(float(r["val/loss"]), float(r["val/ppl"])) for r in rows if r.get("val/loss")]
    assert value == pytest.approx(val[-1][0])  # optimized_metric: the last val/loss
    for loss, ppl in val:  # equal-length windows: perplexity is exp(mean loss)
        assert ppl == pytest.approx(math.exp(loss), rel=1e-4)
    assert (run_dir / "samples.txt").read_text().count("=== Sample") == 3  # sanity + 2 epochs
    module, _checkpoint = load_module(run_dir / "checkpoints" / "last.ckpt")
    assert isinstance(module, LanguageModel)
    assert module.vocabulary == Vocabulary(TINY_CORPUS)


@pytest.mark.slow
def test_the_nanogpt_recipe_runs_by_steps_and_tests_on_the_validation_text(
    compose_config, tmp_path
) -> None:
    """experiment=charlm_shakespeare, shrunk: step-based, validated every few steps across
    epochs, tested on the validation text."""
    corpus = tmp_path / "tiny.txt"
    corpus.write_text(TINY_CORPUS * 4, encoding="utf-8")
    cfg = compose_config(
        "experiment=charlm_shakespeare", "data.download=null", f"data.path={corpus}",
        "data.context_length=16", "data.batch_size=4", "model.net.d_model=32",
        "model.net.num_layers=1", "model.net.num_heads=2", "model.sample_length=0",
        "trainer=cpu", "trainer.max_steps=10", "trainer.val_check_interval=5", *QUIET,
    )  # fmt: skip
    with open_dict(cfg):
        cfg.trainer.limit_train_batches = 7
    value = run(cfg)
    rows = read_metrics(tmp_path / "run")
    val = {int(r["step"]): float(r["val/loss"]) for r in rows if r.get("val/loss")}
    test = [float(r["test/loss"]) for r in rows if r.get("test/loss")]
    assert sorted(val) == [4, 9]  # every 5 steps, across the 2 epochs of 7 steps
    assert value == pytest.approx(val[9])
    # The weights it ended with (validated at its last step), on the same text.
    assert test == [pytest.approx(val[9], rel=1e-5)]


def sampled(argv: list[str]) -> str:
    """The text `python -m kindling.sample <argv>` prints."""
    return sample_cli.sample(cli.parse(sample_cli.SampleArgs, argv, sample_cli.USAGE))


def test_sampling_needs_only_the_checkpoint(compose_config, tmp_path, monkeypatch) -> None:
    corpus = tmp_path / "tiny.txt"
    corpus.write_text(TINY_CORPUS, encoding="utf-8")
    run(compose_config(*tiny_experiment("lstm", corpus, "trainer.max_epochs=1")))
    checkpoint = tmp_path / "elsewhere" / "model.ckpt"
    checkpoint.parent.mkdir()
    shutil.move(tmp_path / "run" / "checkpoints" / "last.ckpt", checkpoint)
    corpus.unlink()
    monkeypatch.chdir(checkpoint.parent)  # no configs/ folder here

    def sample(*args: str) -> str:
        return sampled([f"ckpt_path={checkpoint}", "prompt=Simple", "length=80", *args])

    text = sample("seed=0", "temperature=1.0", "top_k=10")
    assert text.startswith("Simple") and len(text) == len("Simple") + 80
    assert set(text) <= set(TINY_CORPUS)
    assert sample("seed=0", "temperature=1.0", "top_k=10") == text
    assert sample("seed=1", "temperature=1.0", "top_k=10") != text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_experiment_trains_and_samples_on_the_gpu(compose_config, tmp_path) -> None:
    corpus = tmp_path / "tiny.txt"
    corpus.write_text(TINY_CORPUS, encoding="utf-8")
    extra = ["trainer.max_epochs=3", "trainer.limit_train_batches=10"]
    run(compose_config(*tiny_experiment("transformer", corpus, *extra, trainer="gpu")))
    run_dir = tmp_path / "run"
    val = [float(r["val/loss"]) for r in read_metrics(run_dir) if r.get("val/loss")]
    assert len(val) == 3 and val[-1] < val[0]
    # Sampled on the GPU after each validation, the sanity check's included.
    assert (run_dir / "samples.txt").read_text().count("=== Sample") == 4

    def sample(seed: int) -> str:
        checkpoint = run_dir / "checkpoints" / "last.ckpt"
        argv = [f"ckpt_path={checkpoint}", "device=cuda", "prompt=Simple", "length=60"]
        return sampled([*argv, f"seed={seed}"])

    text = sample(0)
    assert text.startswith("Simple") and len(text) == len("Simple") + 60
    assert set(text) <= set(TINY_CORPUS)
    assert sample(0) == text != sample(1)  # a generator on the GPU, seeded


def test_sampling_a_classifier_checkpoint_is_a_user_error(trained_run) -> None:
    with pytest.raises(UserError, match="not a LanguageModel"):
        sampled([f"ckpt_path={trained_run.last_checkpoint}"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "ckpt_path=<file>"),
        (["ckpt_path=a.ckpt", "lenght=5"], "Unknown argument 'lenght=5'"),
        (["ckpt_path=a.ckpt", "length=many"], "must be a number"),
        (["ckpt_path=a.ckpt", "top_k=0"], "top_k >= 1"),
        (["ckpt_path=missing.ckpt"], "does not exist"),
    ],
)
def test_bad_sample_arguments_are_one_line(argv: list[str], message: str, caplog) -> None:
    with pytest.raises(SystemExit) as stopped:
        sample_cli.main(argv)
    assert stopped.value.code == 1
    (line,) = error_lines(caplog)
    assert message in line, line


def test_sample_arguments_are_read_like_overrides() -> None:
    argv = ["ckpt_path=x.ckpt", "prompt=a\\nb", "top_k=null", "length=7"]
    args = cli.parse(sample_cli.SampleArgs, argv, sample_cli.USAGE)
    assert args.prompt == "a\nb" and args.top_k is None and args.length == 7


@pytest.mark.slow
def test_train_py_then_sample_from_another_folder(tmp_path: Path) -> None:
    """The commands a user types: train with train.py, sample with `python -m kindling.sample`."""
    corpus = tmp_path / "tiny.txt"
    corpus.write_text(TINY_CORPUS, encoding="utf-8")
    train = train_py(*tiny_experiment("lstm", corpus, "trainer.max_epochs=1"), cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    assert "Sample at step 0 (before training)" in train.stdout + train.stderr
    (run_dir,) = (tmp_path / "logs" / "charlm" / "runs").iterdir()
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    corpus.unlink()
    (tmp_path / "elsewhere").mkdir()

    argv = [f"ckpt_path={checkpoint}", "prompt=Flat", "length=60", "seed=0"]
    first = subprocess.run(
        [*PYTHON, "-m", "kindling.sample", *argv],
        cwd=tmp_path / "elsewhere",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    # The same seed samples the same text in another process: this one.
    assert first.stdout == sampled(argv) + "\n" and first.stdout.startswith("Flat")
    assert len(first.stdout) == len("Flat") + 60 + 1  # and print's newline

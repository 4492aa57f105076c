"""`<dir>/kindling.json`, the description `python -m kindling.prepare` writes beside a prepared
copy: the format, the kind of samples (`images` or `sequences`), class names, each split's
sample count, the image shape or the feature names, `num_features` and `max_length`, and the
training split's statistics. Written first without `complete` (the folder is kindling's, the
work under way), then with `complete: true` once every split is written.
"""

import json
from pathlib import Path
from typing import Any

from kindling.config.errors import UserError

METADATA_FILE = "kindling.json"
# A sample: `{"index", "image", "label"}` (uint8 `(C, H, W)`) or, where `kind` is sequences,
# `{"index", "steps", "label"}` (float32 `(T, F)` as the table holds them); 2: each split in a
# seeded random order.
FORMAT = 2
IMAGES, SEQUENCES = "images", "sequences"
OLDER_FORMATS = {1: " (format 1 streams samples in the source's order, nearly sorted by class)"}
SPLITS = ("train", "val", "test")
S3_TIMEOUT_S = 10  # per attempt: an unreachable address fails in seconds, not after retries


def is_remote(location: str) -> bool:
    return "://" in location


def read_metadata(input_dir: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The description of the prepared copy at `input_dir`, checked complete and readable."""
    location = f"{input_dir.rstrip('/')}/{METADATA_FILE}"
    if input_dir.startswith("s3://"):
        text = _read_s3(location, storage_options or {})
    elif is_remote(input_dir):
        raise UserError(
            f"data.input_dir={input_dir}: kindling streams from a local folder or s3://; "
            "copy the prepared folder to one of them."
        )
    else:
        path = Path(input_dir) / METADATA_FILE
        if not path.is_file():
            raise UserError(
                f"data.input_dir={input_dir} is not a prepared copy (no {METADATA_FILE}). "
                "Write one with: python -m kindling.prepare data=<data config> output="
                f"{input_dir}"
            )
        text = path.read_text()
    try:
        metadata = json.loads(text)
    except ValueError as error:
        raise UserError(
            f"{location} is damaged ({error}). Prepare the data again into an empty folder."
        ) from error
    again = f"python -m kindling.prepare data=<data config> output={input_dir}"
    if metadata.get("format") != FORMAT:
        raise UserError(
            f"data.input_dir={input_dir} was prepared by kindling "
            f"{metadata.get('kindling_version', '(unknown)')} (format {metadata.get('format')}); "
            f"this kindling reads format {FORMAT}{OLDER_FORMATS.get(metadata.get('format'), '')}. "
            f"Prepare it again: {again}"
        )
    if not metadata.get("complete"):
        raise UserError(
            f"data.input_dir={input_dir} is an unfinished prepare (it was interrupted). "
            f"Run it again to finish: {again}"
        )
    return metadata


def check_chunks(input_dir: str) -> None:
    """Every chunk file that each split's LitData `index.json` names is there, with at least the
    bytes it records: LitData would wait for a deleted or cut-short chunk mid-epoch, then stop
    with a timeout that blames a download. A copy on object storage is checked as it is read."""
    if is_remote(input_dir):
        return
    for split in SPLITS:
        folder = Path(input_dir) / split
        index = folder / "index.json"
        try:
            chunks = json.loads(index.read_text())["chunks"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise UserError(damaged(index, "cannot be read", input_dir)) from error
        for chunk in chunks:
            path, recorded = folder / chunk["filename"], chunk.get("chunk_bytes")
            if not path.is_file():
                raise UserError(damaged(path, "is missing", input_dir))
            size = path.stat().st_size
            if recorded is not None and size < recorded:
                raise UserError(
                    damaged(path, f"is cut short ({size} of its {recorded} bytes)", input_dir)
                )


def damaged(path: Path | str, what: str, input_dir: str) -> str:
    return (
        f"{path} {what}: the prepared copy data.input_dir={input_dir} is damaged. Prepare it "
        "again into an empty folder: python -m kindling.prepare data=<data config> "
        "output=<empty folder>"
    )


def _read_s3(url: str, storage_options: dict[str, Any]) -> str:
    """The object at `url`, with short timeouts and messages that say what went wrong."""
    import boto3  # LitData's S3 client; only s3:// needs it
    import botocore.config
    import botocore.exceptions as s3

    bucket, _, key = url.removeprefix("s3://").partition("/")
    config = botocore.config.Config(
        connect_timeout=S3_TIMEOUT_S,
        read_timeout=S3_TIMEOUT_S,
        retries={"max_attempts": 2, "mode": "standard"},
    )
    credentials = (
        "credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, ~/.aws/credentials "
        "(AWS_PROFILE) or the machine's role"
    )
    try:
        client = boto3.client("s3", config=config, **storage_options)
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        return body.read().decode()
    except s3.NoCredentialsError as error:
        raise UserError(f"No credentials for {url}: {credentials}.") from error
    except (s3.EndpointConnectionError, s3.ConnectTimeoutError, s3.ReadTimeoutError) as error:
        raise UserError(
            f"{url} cannot be reached ({error}). Check the network, the address, and the "
            "endpoint (AWS_ENDPOINT_URL or data.storage_options.endpoint_url)."
        ) from error
    except s3.ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        if code in ("NoSuchKey", "404"):
            raise UserError(
                f"{url} does not exist: data.input_dir is not a prepared copy. Upload the "
                "folder that python -m kindling.prepare wrote."
            ) from error
        if code in ("NoSuchBucket",):
            raise UserError(f"{url}: there is no bucket {bucket!r}. Fix data.input_dir.") from error
        raise UserError(
            f"{url} refused ({code}: {error}): the credentials are not allowed to read it; "
            f"{credentials}."
        ) from error
    except (s3.BotoCoreError, ValueError) as error:  # a bad endpoint URL, region, ...
        raise UserError(
            f"{url}: {error}. Fix data.storage_options or the AWS_* settings."
        ) from error

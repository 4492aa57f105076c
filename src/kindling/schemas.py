"""JSON schemas of the configs for an editor's YAML language server (docs/editors.md): run in the
repository's root, `python -m kindling.schemas` writes `.schemas/<group>/<name>.json` for each
`configs/<group>/` file whose node holds a `_target_`, and maps the files to them in
`.vscode/settings.json`.
"""

import contextlib
import dataclasses
import enum
import functools
import inspect
import json
import numbers
import os
import re
import shutil
import types
import typing
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.utils import get_object
from omegaconf import OmegaConf

from kindling import cli
from kindling.errors import UserError

INTERPOLATION = r"\$\{|^\?\?\?$"  # "${...}" anywhere in a string, or OmegaConf's "???" (missing)
STRING, BOOLEAN = {"type": ["string"]}, {"type": ["boolean"]}
HYDRA_KEYS = {"_target_": STRING, "_convert_": STRING, "_partial_": BOOLEAN, "_recursive_": BOOLEAN}
SCALARS = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}


def _file_schema(file: Path, name: str) -> dict[str, dict]:
    """{name: the schema of `file`}, or nothing where its node builds nothing."""
    raw = OmegaConf.to_container(OmegaConf.load(file)) or {}
    header = re.match(r"# @package (\S+)", file.read_text())
    group, option = name.rsplit("/", 1)
    package = header[1] if header else group.replace("/", ".")
    if package.split(".")[0] == "hydra":  # Hydra's node: its plugins complete it
        node, below = raw, {}
    else:  # the file composed, and its defaults list alone: what the file need not give
        ConfigStore.instance().store(
            f"{option}.below", {"defaults": raw.get("defaults", [])}, group, package
        )
        configs = file.parents[name.count("/")]
        within_train = group in _extended_by_train(configs)
        node = _composed(group, option, package, within_train)
        below = _composed(group, f"{option}.below", package, within_train)
    if not _has_target(node):
        return {}
    schema = _node_schema(node, below, optional="_base/" in name)
    schema["properties"]["defaults"] = {"type": "array"}  # Hydra's defaults list
    return {name: {"$schema": "http://json-schema.org/draft-07/schema#", **schema}}


@functools.cache
def _extended_by_train(configs: Path) -> frozenset[str]:
    """The groups whose options train.yaml's defaults list extends: `model/optimizer: adamw`
    gives every model config its optimizer."""
    defaults = OmegaConf.to_container(OmegaConf.load(configs / "train.yaml")).get("defaults", [])
    chosen = [next(iter(entry)) for entry in defaults if isinstance(entry, dict)]
    return frozenset(name.rsplit("/", 1)[0] for name in chosen if "/" in name)


def _composed(group: str, option: str, package: str, within_train: bool = False) -> Any:
    """The file composed: alone, or within train.yaml where that adds to it (`within_train`)."""
    with warnings.catch_warnings():  # "Defaults list is missing `_self_`": a group file's is last
        warnings.simplefilter("ignore", UserWarning)
        if package == "_global_":
            return OmegaConf.to_container(compose("train", [f"{group}={option}"]))
        whole = compose("train", [f"{group}={option}"]) if within_train else None
        return OmegaConf.to_container(
            OmegaConf.select(whole or compose(f"{group}/{option}"), package)
        )


def _has_target(node: Any) -> bool:
    values = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
    return (isinstance(node, dict) and "_target_" in node) or any(map(_has_target, values))


def _node_schema(node: Any, below: Any, optional: bool = False) -> dict:
    """`node`'s schema, `node` holding targets; `below` is what the file's defaults list gives."""
    below = below if isinstance(below, dict) else {}
    if isinstance(node, list):
        items = [_node_schema(v, {}) if _has_target(v) else {} for v in node]
        return {"type": "array", "items": {"anyOf": items}}
    if "_target_" not in node:
        children = {k: _node_schema(v, below.get(k)) for k, v in node.items() if _has_target(v)}
        return {"type": ["object", "null"], "properties": children}
    target = get_object(node["_target_"])
    arguments, needed, takes_kwargs = _arguments(target)
    properties = dict(HYDRA_KEYS)
    for name, (hint, extras) in arguments.items():
        value = node.get(name)
        schema = _node_schema(value, below.get(name)) if _has_target(value) else _value_schema(hint)
        properties[name] = schema | extras
    required = [] if optional or node.get("_partial_") else [n for n in needed if n not in below]
    doc = _first_sentence((inspect.getdoc(target) or "").split("\n\n")[0])
    return {
        "type": ["object", "null"],
        "description": f"{node['_target_']}: {doc}".rstrip(": "),
        "properties": properties,
        **({"required": required} if required else {}),
        "additionalProperties": takes_kwargs,
    }


def _arguments(target: Any) -> tuple[dict[str, tuple[Any, dict]], list[str], bool]:
    """Per keyword argument of `target`, its hint, and its default and description; those it
    needs; whether it takes other keys. A class whose `__init__` passes `**kwargs` on takes its
    parents' arguments too (never needed: it may pass them itself)."""
    arguments, needed = {}, []
    classes = inspect.getmro(target)[:-1] if inspect.isclass(target) else ()
    inits = [(c, vars(c)["__init__"]) for c in classes if "__init__" in vars(c)]
    for depth, (owner, function) in enumerate(inits or [(target, target)]):
        try:
            parameters = inspect.signature(function).parameters.values()
        except (TypeError, ValueError):  # no signature to read (some builtins): takes anything
            return arguments, needed, True
        hints = _hints(function)
        doc = "\n".join(inspect.getdoc(f) or "" for f in dict.fromkeys([owner, function]))
        for p in parameters:
            keyword = p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            if not keyword or p.name == "self" or p.name in arguments:
                continue
            words = _first_sentence(_entry(doc, p.name))
            extras = {"description": words} if words else {}
            with contextlib.suppress(TypeError, ValueError):  # a default JSON can write
                extras["default"] = json.loads(json.dumps(p.default, allow_nan=False))
            arguments[p.name] = hints.get(p.name, Any), extras
            needed += [p.name] if p.default is p.empty and depth == 0 else []
        if all(p.kind is not p.VAR_KEYWORD for p in parameters):
            return arguments, needed, False
    return arguments, needed, True


def _hints(function: Any) -> dict[str, Any]:
    """`function`'s argument hints, evaluated as typing.get_type_hints does, but one by one: a
    hint naming what only type checkers import leaves that argument alone untyped."""
    function = inspect.unwrap(function)
    hints = {}
    for name, hint in inspect.get_annotations(function).items():
        with contextlib.suppress(Exception):
            hints[name] = eval(hint, function.__globals__) if isinstance(hint, str) else hint
    return hints


def _value_schema(hint: Any) -> dict:
    """`hint` as a schema that also takes an interpolation."""
    schema = _type_schema(hint)
    kinds = schema.get("type", [])
    if not schema or "string" in kinds:
        return schema
    if kinds and set(schema) <= {"type", "items"}:  # pattern and items judge one kind each
        said = f"Expected {' or '.join(kinds)}, or an ${{...}} interpolation."  # VS Code's words
        kinds = [*kinds, "string"]
        return schema | {"type": kinds, "pattern": INTERPOLATION, "patternErrorMessage": said}
    return {"anyOf": [*schema.get("anyOf", [schema]), {"type": "string", "pattern": INTERPOLATION}]}


def _type_schema(hint: Any) -> dict:
    """What YAML can write for `hint`. An instance of a class that has no YAML literal is a node
    that builds one (`_target_`), an object."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        members = [_type_schema(a) for a in args]
        if not all(members):  # one member takes anything: so does the union
            return {}
        if all(set(m) == {"type"} for m in members):
            return {"type": sorted({kind for m in members for kind in m["type"]})}
        return {"anyOf": members}
    kind = origin or hint
    if kind in (Any, object) or not isinstance(kind, type) or issubclass(kind, enum.Enum):
        return {}  # a TypeVar, ...; an Enum a target may take by name or by value
    for base, name in (*SCALARS.items(), (os.PathLike, "string"), (numbers.Real, "number")):
        if issubclass(kind, base):
            return {"type": [name]}
    if kind.__module__ in ("builtins", "collections.abc") and issubclass(kind, Iterable):
        if issubclass(kind, Mapping):
            return {"type": ["object"]}
        items = [_value_schema(a) for a in args if a is not ...] or [{}]  # tuple[int, ...]
        return {
            "type": ["array"],
            "items": items[0] if items.count(items[0]) == len(items) else {"anyOf": items},
        }
    return {"type": ["object"]}


def _entry(doc: str, name: str) -> str:
    """`name`'s entry in a docstring's argument list (`name: ...` or `name (type): ...`)."""
    entry = re.search(rf"^(\s*){name}(?: \([^)]*\))?: (.*(?:\n\1\s+\S.*)*)", doc, re.MULTILINE)
    return entry[2] if entry else ""


def _first_sentence(text: str) -> str:
    return re.split(r"(?<=\.)\s", " ".join(text.split()), maxsplit=1)[0]


def write(root: Path) -> None:
    """Writes the schemas of `root/configs` to `root/.schemas` and maps each file to its schema in
    `root/.vscode/settings.json` (its other settings kept). A schema is named by its config's
    path in `configs`, without `.yaml`."""
    configs = root / "configs"
    if not configs.is_dir():
        raise UserError(f"No {configs}/: run python -m kindling.schemas in the repository's root.")
    schemas = {}
    with initialize_config_dir(str(configs.resolve()), version_base=None):
        for file in sorted(configs.glob("*/**/*.yaml")):
            name = file.relative_to(configs).with_suffix("").as_posix()
            if name.startswith("local/"):  # a machine's own configs: none
                continue
            try:
                schemas |= _file_schema(file, name)
            except Exception as error:  # a target that does not import, a file Hydra refuses
                raise UserError(f"configs/{name}.yaml: {' '.join(str(error).split())}") from error
    shutil.rmtree(root / ".schemas", ignore_errors=True)  # no schema outlives its config
    for name, schema in schemas.items():
        file = root / ".schemas" / f"{name}.json"
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(schema, indent=1) + "\n")
    settings_file = root / ".vscode" / "settings.json"
    settings = json.loads(settings_file.read_text()) if settings_file.exists() else {}
    settings["yaml.schemas"] = {f".schemas/{n}.json": f"configs/{n}.yaml" for n in schemas}
    settings_file.parent.mkdir(exist_ok=True)
    settings_file.write_text(json.dumps(settings, indent=2) + "\n")


@dataclasses.dataclass
class SchemasArgs:  # none: it reads ./configs and writes beside it
    pass


@cli.command(SchemasArgs, "python -m kindling.schemas (in the repository's root)")
def main(args: SchemasArgs) -> None:
    configs = len([f for f in Path("configs").glob("*/**/*.yaml") if not f.match("local/*")])
    print(f"Reading the classes of {configs} configs in configs/ (seconds) ...", flush=True)
    write(Path.cwd())
    written = len(list(Path(".schemas").rglob("*.json")))
    print(f"Wrote {written} schemas to .schemas/ and their files to .vscode/settings.json.")


if __name__ == "__main__":
    main()

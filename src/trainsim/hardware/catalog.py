"""The packaged device and system catalogs: lookup by name, alias or YAML path.

Files live in ``trainsim/hardware/data`` (``device_*.yaml``, ``system_*.yaml``). Nothing is
read at import time; the first lookup reads and validates the catalog once and caches it.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from trainsim.errors import ConfigError, read_utf8, yaml_error
from trainsim.hardware.schema import SCHEMA_VERSION, DeviceSpec, SystemSpec

_M = TypeVar("_M", bound=BaseModel)
# libyaml's safe loader where PyYAML was built with it: the same documents, ~8x faster (for the
# packaged catalog only: its error wording differs, so users' files keep PyYAML's own messages)
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _norm(name: str) -> str:
    """Lookup key: case, spaces, dashes and underscores do not matter ("A100-SXM4-40GB" == "a100 sxm4 40gb")."""
    return re.sub(r"[\s_\-]+", "", name.strip().lower())


def _load_yaml(text: str, origin: str, model: type[_M], *, packaged: bool = False) -> _M:
    try:
        doc = yaml.load(text, Loader=_FAST_LOADER) if packaged else yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise yaml_error(origin, e) from None
    if doc is None:  # an empty file (or only comments): said as such, not as a wrong shape
        kind, example = ("system", "dgx-a100") if model is SystemSpec else ("device", "a100-sxm4-80gb")
        raise ConfigError(f"{origin}: file is empty; expected a {kind} YAML mapping "
                          f"(`trainsim hw show {example} --format json` shows one's fields)")  # fmt: skip
    if not isinstance(doc, dict):
        raise ConfigError(f"{origin}: expected a mapping at the top level")
    version = doc.get("schema_version")
    if version is None:
        raise ConfigError(f"{origin}: missing field 'schema_version' (expected {SCHEMA_VERSION})")
    if version != SCHEMA_VERSION:
        raise ConfigError(
            f"{origin}: schema_version {version!r} is not supported (expected {SCHEMA_VERSION})"
        )
    try:
        return model.model_validate(doc)
    except ValidationError as e:
        other = _other_kind(doc, model)
        if other is not None:  # a device file where a system goes, or the reverse
            raise ConfigError(f"{origin}: {other}") from None
        raise ConfigError(f"{origin}: {validation_message(e)}") from None


def _other_kind(doc: dict[Any, Any], model: type[BaseModel]) -> str | None:
    """What to say of a file that is the other kind of hardware file than ``model`` (every
    field of it that the wanted kind lacks is the other kind's): None when it is not one."""
    keys = set(map(str, doc))
    wanted, other = (SystemSpec, DeviceSpec) if model is SystemSpec else (DeviceSpec, SystemSpec)
    foreign = keys - set(wanted.model_fields)
    if not foreign or not foreign <= set(other.model_fields) or not _REQUIRED[other] <= keys:
        return None
    if other is DeviceSpec:
        return ("a device file, not a system (it has no tiers); give a system YAML that names it "
                "(device: this file, gpus_per_node, tiers; `trainsim hw show dgx-a100` shows one), or a catalog system")
    return "a system file, not a device; give its device (the file or catalog name its device field names)"


_REQUIRED = {m: {n for n, f in m.model_fields.items() if f.is_required()} for m in (DeviceSpec, SystemSpec)}


def validation_message(e: ValidationError, prefix: str = "") -> str:
    """One line for a pydantic error: the first field that failed (dotted, under ``prefix``)
    and why, then the names of the others."""

    def where(loc: tuple[int | str, ...]) -> str:
        return ".".join([*([prefix] if prefix else []), *map(str, loc)]) or "(top level)"

    import difflib

    errs = list(e.errors())
    # an unknown key first, with the missing key it most likely misspells: "bandwidth_Gbps" read
    # "field tiers.0.bandwidth_per_gpu_GBps: Field required (also: tiers.0.bandwidth_Gbps)"
    extra = [x for x in errs if x["type"] == "extra_forbidden"]
    if extra:
        x = extra[0]
        missing = [str(m["loc"][-1]) for m in errs if m["type"] == "missing" and m["loc"][:-1] == x["loc"][:-1]]
        close = difflib.get_close_matches(str(x["loc"][-1]), missing, n=1, cutoff=0.3)
        hint = (f" (a misspelling of {close[0]}?)" if close
                else f" (missing here: {', '.join(missing)})" if missing else "")  # fmt: skip
        errs.remove(x)
        errs.insert(0, {**x, "msg": f"unknown field{hint}"})
    others = [where(x["loc"]) for x in errs[1:]]
    shown = ", ".join(others[:6]) + (f" and {len(others) - 6} more" if len(others) > 6 else "")
    more = f" (also: {shown})" if others else ""
    msg = str(errs[0]["msg"]).removeprefix("Value error, ")
    return f"field {where(errs[0]['loc'])}: {msg}{more}"


def _packaged(prefix: str, model: type[_M]) -> dict[str, _M]:
    out: dict[str, _M] = {}
    for entry in sorted(
        resources.files("trainsim.hardware").joinpath("data").iterdir(), key=lambda p: p.name
    ):
        if not (entry.name.startswith(prefix) and entry.name.endswith(".yaml")):
            continue
        spec = _load_yaml(entry.read_text(encoding="utf-8"), f"catalog file {entry.name}", model,
                          packaged=True)  # fmt: skip
        for key in (spec.name, *spec.aliases):  # type: ignore[attr-defined]
            k = _norm(key)
            if k in out and out[k] is not spec:
                raise ConfigError(f"catalog file {entry.name}: name {key!r} is already used")
            out[k] = spec
    return out


@cache
def _devices() -> dict[str, DeviceSpec]:
    return _packaged("device_", DeviceSpec)


@cache
def _systems() -> dict[str, SystemSpec]:
    return _packaged("system_", SystemSpec)


def _is_path(text: str) -> bool:
    """Whether a name-or-path names a YAML file (by its suffix, or because the file exists)."""
    try:
        return text.endswith((".yaml", ".yml")) or Path(text).is_file()
    except OSError:  # e.g. a name longer than the file system allows: not a file
        return False


def _is_folder(text: str) -> bool:
    try:
        return Path(text).is_dir()
    except OSError:
        return False


def _resolve(name_or_path: str | Path, table: dict[str, _M], model: type[_M], what: str) -> _M:
    text = str(name_or_path)
    if _is_path(text):
        path = Path(text)
        return _load_yaml(read_utf8(path, f"{what} file"), str(path), model)
    hit = table.get(_norm(text))
    if hit is None and _is_folder(text):  # an existing folder is no catalog name: say what it is
        raise ConfigError(f"{what} {text}: is a folder; give a {what} YAML file or a catalog name")
    if hit is None:
        names = sorted({s.name for s in table.values()})  # type: ignore[attr-defined]
        close = close_names(text, table)
        hint = f" (close matches: {', '.join(close)})" if close else ""
        raise ConfigError(
            f"unknown {what} {text!r}{hint}; known: {', '.join(names)} (or give a YAML file)"
        )
    return hit


def close_names(text: str, table: dict[str, Any] | None = None) -> list[str]:
    """Catalog names (of ``table``; default: devices and systems) whose names or aliases are
    near ``text``: the "did you mean" of an unknown name."""
    import difflib

    tables: list[dict[str, Any]] = [table] if table is not None else [_devices(), _systems()]
    keys = {k: t[k].name for t in tables for k in t}
    near = difflib.get_close_matches(_norm(text), list(keys), n=5, cutoff=0.6)
    return list(dict.fromkeys(keys[k] for k in near))


def get_device(name_or_path: str | Path) -> DeviceSpec:
    """A device by catalog name, alias (e.g. 'NVIDIA A100-SXM4-40GB') or YAML path."""
    return _resolve(name_or_path, _devices(), DeviceSpec, "device")


def get_system(name_or_path: str | Path) -> SystemSpec:
    """A system by catalog name, alias or YAML path. A system file's ``device`` must resolve;
    a relative device path in it is relative to the file's folder."""
    spec = _resolve(name_or_path, _systems(), SystemSpec, "system")
    text = str(name_or_path)
    return _with_device(spec, Path(text)) if _is_path(text) else spec


def _with_device(spec: SystemSpec, path: Path) -> SystemSpec:
    device = Path(spec.device).expanduser()
    beside = path.parent / device
    if device.is_absolute() and str(device) != spec.device:  # ~/dev.yaml
        spec = spec.model_copy(update={"device": str(device)})
    elif not device.is_absolute() and (spec.device.endswith((".yaml", ".yml")) or _is_path(str(beside))):
        spec = spec.model_copy(update={"device": str(beside)})
    try:
        get_device(spec.device)
    except ConfigError as e:
        raise ConfigError(f"{path}: field device: {e}") from None
    return spec


def find_device(name: str) -> DeviceSpec | None:
    """The device whose name or alias matches ``name`` exactly (normalized), else None."""
    return _devices().get(_norm(name))


def catalog_name(name: str) -> str:
    """The catalog name of the device ``name`` denotes: its name or any of its aliases, as
    :func:`find_device` matches them (a YAML copy named ``NVIDIA A100-SXM4-80GB``, the name
    nvidia-smi prints, is ``a100-sxm4-80gb``); a name the catalog lacks is its own. Kernel and
    comm models meet devices by it."""
    d = find_device(name)
    return d.name if d is not None else name


def list_devices() -> list[DeviceSpec]:
    return sorted({id(s): s for s in _devices().values()}.values(), key=lambda s: s.name)


def list_systems() -> list[SystemSpec]:
    return sorted({id(s): s for s in _systems().values()}.values(), key=lambda s: s.name)

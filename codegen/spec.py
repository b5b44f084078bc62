"""Kernel families as data: load a spec, enumerate its variants for a target, validate them.

A Variant is the single source of every name: its URI is the generated file's stem, the
build directory, the exported symbol, the lock name and the dispatch key.
"""
from __future__ import annotations

import itertools
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from .targets import Target, get_target

SPEC_DIR = Path(__file__).parent / "specs"


@dataclass(frozen=True)
class Axis:
    name: str
    values: tuple | str          # a tuple, or "target" (the target's FP8 formats)
    token: str = "{}"

    def choices(self, target: Target) -> tuple:
        if self.values == "target":
            return tuple(f.token for f in target.fp8_formats) or ("none",)
        return self.values

    def uri_part(self, value: Any) -> str:
        if isinstance(value, bool):
            return self.token if value else ""
        return self.token.format(value)


@dataclass(frozen=True)
class Family:
    name: str
    template: str
    axes: tuple[Axis, ...]
    requires_fp8: bool

    def axis(self, name: str) -> Axis:
        return next(a for a in self.axes if a.name == name)


@dataclass(frozen=True)
class Variant:
    family: str
    arch: str
    params: tuple[tuple[str, Any], ...]

    def __getitem__(self, key: str) -> Any:
        for k, v in self.params:
            if k == key:
                return v
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    @property
    def target(self) -> Target:
        return get_target(self.arch)

    @property
    def spec(self) -> Family:
        return load_family(self.family)

    @property
    def uri(self) -> str:
        parts = [self.family]
        for axis in self.spec.axes:
            part = axis.uri_part(self[axis.name])
            if part:
                parts.append(part)
        return "_".join(parts)

    @property
    def fp8(self):
        """The Fp8Format of this variant (None for families without FP8)."""
        token = self.get("fp8")
        if token in (None, "none"):
            return None
        return next(f for f in self.target.fp8_formats if f.token == token)


@cache
def load_family(name: str) -> Family:
    path = SPEC_DIR / f"{name}.toml"
    if not path.exists():
        known = sorted(p.stem for p in SPEC_DIR.glob("*.toml"))
        raise ValueError(f"unknown kernel family {name!r}; known: {known}")
    raw = tomllib.loads(path.read_text())
    axes = tuple(
        Axis(a["name"], a["values"] if a["values"] == "target" else tuple(a["values"]),
             a.get("token", "{}"))
        for a in raw["axes"])
    return Family(raw["family"], raw["template"], axes, bool(raw.get("requires_fp8", False)))


def families() -> list[str]:
    return sorted(p.stem for p in SPEC_DIR.glob("*.toml"))


def make_variant(family: str, arch: str, **params: Any) -> Variant:
    """A variant from explicit axis values; every axis must be given, and only those."""
    fam = load_family(family)
    names = [a.name for a in fam.axes]
    missing = [n for n in names if n not in params]
    extra = [n for n in params if n not in names]
    if missing or extra:
        raise ValueError(f"{family}: missing axes {missing}, unknown axes {extra}")
    get_target(arch)
    return Variant(family, arch, tuple((n, params[n]) for n in names))


def enumerate_variants(family: str, target: Target) -> list[Variant]:
    fam = load_family(family)
    choices = [axis.choices(target) for axis in fam.axes]
    return [Variant(family, target.arch, tuple(zip((a.name for a in fam.axes), combo)))
            for combo in itertools.product(*choices)]


def validate(variant: Variant) -> str | None:
    """Why this variant cannot exist on its target, or None when it can."""
    from .families import get as get_family

    target, fam = variant.target, variant.spec
    if fam.requires_fp8 and not target.has_fp8:
        return (f"{target.arch} has no FP8 conversion instruction "
                f"(v_cvt_pk_fp8_f32 / cvt.e4m3x2); FP8 variants are not built for it")
    for axis in fam.axes:
        if variant[axis.name] not in axis.choices(target):
            return f"{axis.name}={variant[axis.name]!r} is not one of {axis.choices(target)}"
    return get_family(variant.family).validate(variant)

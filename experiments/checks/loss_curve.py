"""A loss curve (strictly increasing steps, one loss and optionally one grad norm each) and its reader from
CSV or JSON files; anything malformed is a CurveError whose message is one line naming the file and the problem."""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from cost_model.nouns.errors import AttuneError
from cost_model.nouns.names import shown
from cost_model.nouns.user_file import parse_json, read_user_text


class CurveError(AttuneError, ValueError):
    """A loss curve that cannot be read or compared; the message is one line."""


@dataclass(frozen=True)
class Curve:
    """A loss curve: strictly increasing integer steps, one loss (and optionally a grad norm) each."""

    steps: tuple[int, ...]
    losses: tuple[float, ...]
    grad_norms: tuple[float, ...] | None = None
    source: str = ""

    def __post_init__(self) -> None:
        where = self.source or "curve"
        if len(self.steps) != len(self.losses):
            raise CurveError(f"{where}: {len(self.steps)} steps but {len(self.losses)} losses")
        if self.grad_norms is not None and len(self.grad_norms) != len(self.steps):
            raise CurveError(f"{where}: {len(self.steps)} steps but {len(self.grad_norms)} grad norms")
        if not self.steps:
            raise CurveError(f"{where}: no data points")
        for i in range(1, len(self.steps)):
            if self.steps[i] == self.steps[i - 1]:
                raise CurveError(f"{where}: duplicate step {self.steps[i]}")
            if self.steps[i] < self.steps[i - 1]:
                raise CurveError(f"{where}: steps not sorted: step {self.steps[i]} after step {self.steps[i - 1]}")

    def __len__(self) -> int:
        return len(self.steps)

    @classmethod
    def from_values(cls, losses: Iterable[float], grad_norms: Iterable[float] | None = None, *,
                    first_step: int = 0, source: str = "") -> "Curve":
        losses = tuple(float(x) for x in losses)
        norms = None if grad_norms is None else tuple(float(x) for x in grad_norms)
        return cls(tuple(range(first_step, first_step + len(losses))), losses, norms, source)


def _number(value: Any, what: str, where: str) -> float:
    """A loss or grad norm: a JSON number or a numeric string; NaN/Inf are data (the check fails on them)."""
    if isinstance(value, bool) or value is None:
        raise CurveError(f"{where}: non-numeric {what} {json.dumps(value)}")
    if isinstance(value, int):
        # an integer past float's range is an overflowing loss: data (Inf), as a float literal would be
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, float):
        return value
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise CurveError(f"{where}: non-numeric {what} {shown(value)}")


def _step(value: Any, where: str) -> int:
    if isinstance(value, bool) or value is None:
        raise CurveError(f"{where}: non-numeric step {json.dumps(value)}")
    if isinstance(value, int):
        return value
    number: float | None = None
    if isinstance(value, float):
        number = value
    elif isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                raise CurveError(f"{where}: non-numeric step {shown(value)}") from None
    if number is None:
        raise CurveError(f"{where}: non-numeric step {shown(value)}")
    if not math.isfinite(number) or number != int(number):
        raise CurveError(f"{where}: step {shown(value)} is not an integer")
    return int(number)


def _build(path: str, rows: list[tuple[str, Any, Any, Any]], has_norm: bool) -> Curve:
    """rows: (where, step, loss, grad_norm) in file order; checks order and duplicates per row."""
    if not rows:
        raise CurveError(f"{path}: no data points")
    steps: list[int] = []
    losses: list[float] = []
    norms: list[float] = []
    seen: dict[int, str] = {}
    for where, step_raw, loss_raw, norm_raw in rows:
        step = _step(step_raw, where)
        if step in seen:
            raise CurveError(f"{where}: duplicate step {step} (first at {seen[step].split(': ', 1)[-1]})")
        if steps and step < steps[-1]:
            raise CurveError(f"{where}: steps not sorted: step {step} after step {steps[-1]}")
        seen[step] = where
        steps.append(step)
        losses.append(_number(loss_raw, "loss", where))
        if has_norm:
            norms.append(_number(norm_raw, "grad_norm", where))
    return Curve(tuple(steps), tuple(losses), tuple(norms) if has_norm else None, path)


def _parse_csv(path: str, text: str) -> Curve:
    try:
        records = list(csv.reader(io.StringIO(text)))
    except csv.Error as e:   # a field over csv's size limit, a NUL byte: malformed, in one line
        raise CurveError(f"{path}: malformed CSV: {' '.join(str(e).split())[:120]}") from None
    header: list[str] | None = None
    rows: list[tuple[str, Any, Any, Any]] = []
    cols: dict[str, int] = {}
    for line_no, record in enumerate(records, start=1):
        if not record or all(not cell.strip() for cell in record):
            continue
        if header is None:
            header = [cell.strip().lower() for cell in record]
            for name in ("step", "loss"):
                if name not in header:
                    raise CurveError(f"{path}: missing column '{name}' in the header line "
                                     f"(found: {', '.join(map(shown, header[:6])) if header else 'nothing'}; expected step,loss[,grad_norm])")
            for name in ("step", "loss", "grad_norm"):
                if header.count(name) > 1:
                    raise CurveError(f"{path}: column '{name}' appears twice in the header")
                if name in header:
                    cols[name] = header.index(name)
            continue
        where = f"{path}: line {line_no}"
        values = {}
        for name, index in cols.items():
            if index >= len(record) or not record[index].strip():
                raise CurveError(f"{where}: missing value for '{name}'")
            values[name] = record[index]
        rows.append((where, values["step"], values["loss"], values.get("grad_norm")))
    if header is None:
        raise CurveError(f"{path}: empty file (expected a header step,loss[,grad_norm])")
    return _build(path, rows, "grad_norm" in cols)


def _parse_json(path: str, text: str) -> Curve:
    data = parse_json(text, path, CurveError)
    rows: list[tuple[str, Any, Any, Any]] = []
    if isinstance(data, list):
        has_norm = bool(data) and isinstance(data[0], dict) and "grad_norm" in data[0]
        for i, rec in enumerate(data):
            where = f"{path}: record {i}"
            if not isinstance(rec, dict):
                raise CurveError(f"{where}: expected an object with 'step' and 'loss', got {type(rec).__name__}")
            for name in ("step", "loss"):
                if name not in rec:
                    raise CurveError(f"{where}: missing field '{name}'")
            if ("grad_norm" in rec) != has_norm:
                raise CurveError(f"{where}: field 'grad_norm' {'missing' if has_norm else 'present'} "
                                 f"(record 0 {'has' if has_norm else 'lacks'} it)")
            rows.append((where, rec["step"], rec["loss"], rec.get("grad_norm")))
        return _build(path, rows, has_norm)
    if isinstance(data, dict):
        for name in ("steps", "losses"):
            if name not in data:
                raise CurveError(f"{path}: missing field '{name}' (expected {{\"steps\": [...], \"losses\": [...]"
                                 f"[, \"grad_norms\": [...]]}} or a list of {{step, loss[, grad_norm]}} records)")
        names = ("steps", "losses", "grad_norms") if "grad_norms" in data else ("steps", "losses")
        for name in names:
            if not isinstance(data[name], list):
                raise CurveError(f"{path}: field '{name}' must be a list, got {type(data[name]).__name__}")
        lengths = {name: len(data[name]) for name in names}
        if len(set(lengths.values())) > 1:
            raise CurveError(f"{path}: lists of different lengths: "
                             + ", ".join(f"{name} {n}" for name, n in lengths.items()))
        has_norm = "grad_norms" in data
        for i in range(lengths["steps"]):
            rows.append((f"{path}: index {i}", data["steps"][i], data["losses"][i],
                         data["grad_norms"][i] if has_norm else None))
        return _build(path, rows, has_norm)
    raise CurveError(f"{path}: expected a JSON list of records or an object with 'steps' and 'losses', "
                     f"got {type(data).__name__}")


def load_curve(path: str | Path) -> Curve:
    """Read a loss curve from CSV (header step,loss[,grad_norm]) or JSON.

    JSON: a list of {"step", "loss"[, "grad_norm"]} records, or {"steps": [...], "losses": [...]
    [, "grad_norms": [...]]}. The format follows the suffix (.csv / .json), else the first character.
    NaN and Inf values are read as data (the check fails on them). Anything malformed raises
    CurveError with one line naming the file and the problem.
    """
    name = str(path)
    p = Path(path)
    text = read_user_text(p, CurveError, "loss curve")
    suffix = p.suffix.lower()
    if suffix == ".json" or (suffix != ".csv" and text.lstrip()[:1] in ("[", "{")):
        return _parse_json(name, text)
    return _parse_csv(name, text)


"""Results of a check: per-layer records, the rich table, and the JSON document."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import List, Optional

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .compare import Comparison, Index, Thresholds

#: Layer statuses. ``flagged`` and ``error`` fail the check; ``not isolatable`` does not by itself
#: (the whole-model comparison that it triggers decides).
OK, FLAGGED, NOT_ISOLATABLE, ERROR = "ok", "flagged", "not isolatable", "error"

#: Version of the JSON layout written by :meth:`Report.to_dict`.
JSON_SCHEMA = 1


@dataclass
class LayerResult:
    """The comparisons of one checked unit: a module call, the whole model, or one STFT setting.

    ``name`` is the module's path in the model (``(model)`` for the root), ``kind`` its class name,
    ``call`` the 1-based call number for modules called more than once, ``seconds`` the wall time
    spent on it.
    """

    name: str
    kind: str
    call: int = 1
    status: str = OK
    message: str = ""
    comparisons: List[Comparison] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def label(self) -> str:
        return self.name if self.call == 1 else f"{self.name} (call {self.call})"

    @property
    def failed(self) -> bool:
        return self.status in (FLAGGED, ERROR)

    def settle(self) -> "LayerResult":
        """Set ``status`` to flagged when any comparison is flagged (ok otherwise); returns self."""
        if self.status == OK and any(c.flagged for c in self.comparisons):
            self.status = FLAGGED
        return self

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "call": self.call,
            "status": self.status,
            "message": self.message,
            "seconds": round(self.seconds, 4),
            "comparisons": [c.to_dict() for c in self.comparisons],
        }


@dataclass
class Report:
    """Everything one run of the check found.

    ``layers`` holds the per-layer results in call order, ``whole_model`` the end-to-end comparison
    when it ran (judged against ``whole_model_thresholds``), ``stft`` the STFT reference results,
    ``messages`` explanations for the reader (fallbacks, dtype substitutions).
    """

    device: str
    dtype: str
    thresholds: Thresholds
    layers: List[LayerResult] = field(default_factory=list)
    whole_model: Optional[LayerResult] = None
    whole_model_thresholds: Optional[Thresholds] = None
    stft: List[LayerResult] = field(default_factory=list)
    messages: List[str] = field(default_factory=list)
    seconds: float = 0.0

    def results(self) -> List[LayerResult]:
        """All results: layers, then the whole model, then the STFT settings."""
        return self.layers + ([self.whole_model] if self.whole_model else []) + self.stft

    @property
    def failed(self) -> List[LayerResult]:
        """The results that fail the check (flagged or errors)."""
        return [r for r in self.results() if r.failed]

    @property
    def flagged(self) -> bool:
        """True when anything is flagged or could not be compared: the CLI then exits 1."""
        return bool(self.failed)

    def to_dict(self) -> dict:
        return {
            "schema": JSON_SCHEMA,
            "device": self.device,
            "dtype": self.dtype,
            "thresholds": self.thresholds.to_dict(),
            "whole_model_thresholds": self.whole_model_thresholds.to_dict() if self.whole_model_thresholds else None,
            "flagged": self.flagged,
            "failed": [r.label for r in self.failed],
            "seconds": round(self.seconds, 3),
            "messages": self.messages,
            "layers": [r.to_dict() for r in self.layers],
            "whole_model": self.whole_model.to_dict() if self.whole_model else None,
            "stft": [r.to_dict() for r in self.stft],
        }

    def write_json(self, path: str) -> None:
        """Write :meth:`to_dict` as JSON (non-finite metrics are null)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2, allow_nan=False)
            f.write("\n")

    def print(self, console: Optional[Console] = None, only_failed: bool = False) -> None:
        """Render the table (all rows, or only failing layers) and a summary with rich."""
        console = console or Console()
        table = Table(title=f"mccl-check: {self.device} {self.dtype} against cpu float64 "
                            f"(cos >= {self.thresholds.cos_min}, rel <= {self.thresholds.rel_max:g})",
                      show_lines=False, header_style="bold")
        for column, justify in (("layer", "left"), ("type", "left"), ("tensor", "left"), ("shape", "left"),
                                ("cos", "right"), ("rel. error", "right"), ("worst index", "left"),
                                ("first bad index", "left"), ("status", "left")):
            table.add_column(column, justify=justify, overflow="fold")
        sections = (self.layers, [self.whole_model] if self.whole_model else [], self.stft)
        for results in sections:
            shown = [r for r in results if r.failed or not only_failed]
            if shown and table.row_count:
                table.add_section()
            for result in shown:
                _add_rows(table, result)
        console.print(table)
        if self.whole_model_thresholds:
            console.print(f"(whole model) judged against cos >= {self.whole_model_thresholds.cos_min}, "
                          f"rel <= {self.whole_model_thresholds.rel_max:g}")
        for message in self.messages:
            console.print(Text.assemble(("note: ", "yellow"), message))
        checked = len(self.results())
        failed = self.failed
        if failed:
            console.print(Text.assemble(("FLAGGED", "bold red"), f": {len(failed)} of {checked} checked units: ",
                                        ", ".join(r.label for r in failed)))
        else:
            console.print(Text.assemble(("PASSED", "bold green"),
                                        f": {checked} checked units, nothing flagged ({self.seconds:.1f} s)"))


def _fmt_index(index: Optional[Index]) -> str:
    if index is None:
        return "-"
    return "(" + ", ".join(str(i) for i in index) + ")"


def _fmt_float(value: float, spec: str) -> str:
    return format(value, spec) if math.isfinite(value) else str(value)


def _add_rows(table: Table, result: LayerResult) -> None:
    style = {FLAGGED: "bold red", ERROR: "bold red", NOT_ISOLATABLE: "yellow"}.get(result.status, "")
    if not result.comparisons:
        table.add_row(Text(result.label), Text(result.kind), "-", "-", "-", "-", "-", "-",
                      Text(f"{result.status}: {result.message}", style=style))
        return
    for i, c in enumerate(result.comparisons):
        status = "FLAGGED" if c.flagged else ("ok (abs)" if c.judged == "absolute" else "ok")
        if c.flagged and c.note:
            status += f": {c.note}"
        if i == 0 and result.message:
            status += f" [{result.message}]"
        row_style = "bold red" if c.flagged or (i == 0 and result.status == ERROR) else (
            "dim" if c.judged == "absolute" else "")
        table.add_row(Text(result.label if i == 0 else ""), Text(result.kind if i == 0 else ""), Text(c.tensor),
                      "x".join(str(d) for d in c.shape) or "scalar", _fmt_float(c.cos, ".6f"),
                      _fmt_float(c.rel_err, ".2e"), _fmt_index(c.worst_index), _fmt_index(c.first_bad_index),
                      Text(status, style=row_style))

"""`python -m examples.bench.sweep_plot EXPERIMENT_DIR`: the curves of a serve sweep, as
`vllm bench sweep plot`, and their markdown table.

Mirrors vllm/benchmarks/sweep/plot.py (plot, _plot_fig, SweepPlotArgs): the bench-serve
result JSONs under EXPERIMENT_DIR (examples/bench/sweep.py's MODEL-concurrencyC.json; the
`.failure.json` records are skipped) are grouped into one curve per --curve-by value
(vLLM: seaborn's hue) with --var-x on the x axis. Where vLLM draws one figure per --var-y,
this draws the --var-y list side by side in one PNG (default: request throughput, median
TTFT, median TPOT against max concurrency), with matplotlib alone (Agg backend; vLLM uses
seaborn and pandas, not installed here), the x axis in log base 2 with a tick at each
value swept, one line with markers per model. The figure is --fig-dir/--fig-name.png
(--fig-dir: a path, by default EXPERIMENT_DIR; vLLM's is relative to it). Defaults differ
from vLLM's for a readable page image: --fig-height 4 (vLLM 6.4) and --fig-dpi 150 (300).

The table (markdown_table, printed last) has one row per point, sorted by curve then x:
request and output throughput, median and mean TTFT and TPOT. It needs no matplotlib, so
examples/bench/sweep.py prints it too. Errors as vLLM's: "No parameter sweep results
under DIR", "Did not find any parameter sweep results under DIR", "Cannot find var_x=...
in parameter sweep results. Available variables: [...]".
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

LABELS = {"max_concurrency": "Max concurrency",
          "request_throughput": "Request throughput (req/s)",
          "output_throughput": "Output token throughput (tok/s)",
          "total_token_throughput": "Total token throughput (tok/s)",
          "median_ttft_ms": "Median TTFT (ms)", "mean_ttft_ms": "Mean TTFT (ms)",
          "median_tpot_ms": "Median TPOT (ms)", "mean_tpot_ms": "Mean TPOT (ms)",
          "median_itl_ms": "Median ITL (ms)", "median_e2el_ms": "Median E2EL (ms)"}
TABLE_COLUMNS = ("max_concurrency", "num_prompts", "failed", "request_throughput",
                 "output_throughput", "median_ttft_ms", "mean_ttft_ms", "median_tpot_ms",
                 "mean_tpot_ms")
DEFAULT_VAR_Y = ("request_throughput", "median_ttft_ms", "median_tpot_ms")


def load_results(output_dir: Path) -> list[dict]:
    """Every bench-serve result under output_dir; "inf"/"nan" strings become floats."""
    records = []
    for path in sorted(output_dir.rglob("*.json")):
        if path.name.endswith(".failure.json"):
            continue
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "request_throughput" in data:
            records.append({k: float(v) if v in ("inf", "-inf", "nan") else v
                            for k, v in data.items()})
    if not records:
        raise ValueError(f"Did not find any parameter sweep results under {output_dir}")
    return records


def check_vars(records: list[dict], names: list[str]) -> None:
    available = sorted({k for r in records for k in r})
    for name in names:
        if any(name not in r for r in records):
            raise ValueError(f"Cannot find {name!r} in parameter sweep results. "
                             f"Available variables: {available}")


def curves(records: list[dict], curve_by: str, var_x: str) -> dict[str, list[dict]]:
    """{curve value: its records sorted by var_x}, curves sorted by name (vLLM's legend)."""
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(str(r[curve_by]), []).append(r)
    return {k: sorted(v, key=lambda r: r[var_x]) for k, v in sorted(out.items())}


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if math.isfinite(value) else str(value)
    return str(value)


def markdown_table(records: list[dict], curve_by: str = "model_id",
                   var_x: str = "max_concurrency") -> str:
    """One row per point: curve, then TABLE_COLUMNS (var_x first)."""
    columns = [var_x, *(c for c in TABLE_COLUMNS if c != var_x)]
    head = ["Model" if curve_by == "model_id" else curve_by,
            *(LABELS.get(c, c.replace("_", " ").capitalize()) for c in columns)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rows in curves(records, curve_by, var_x).items():
        for r in rows:
            cells = [name, *(_cell(r.get(c, "")) for c in columns)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def default_title(records: list[dict]) -> str:
    done = [r for r in records if r.get("completed")]
    if not done:
        return "Serve sweep"
    in_len = sum(r["total_input_tokens"] for r in done) / sum(r["completed"] for r in done)
    out_len = sum(r["total_output_tokens"] for r in done) / sum(r["completed"] for r in done)
    return (f"Serve sweep: {in_len:.0f} prompt + {out_len:.0f} output tokens a request, "
            "infinite request rate")


def draw(records: list[dict], fig_path: Path, *, var_x: str, var_y: list[str],
         curve_by: str, scale_y: str | None, fig_height: float, fig_dpi: int,
         title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    grouped = curves(records, curve_by, var_x)
    xs = sorted({r[var_x] for r in records})
    fig, axes = plt.subplots(1, len(var_y), figsize=(fig_height * 1.25 * len(var_y), fig_height),
                             squeeze=False)
    for ax, y in zip(axes[0], var_y):
        for name, rows in grouped.items():
            ax.plot([r[var_x] for r in rows], [r[y] for r in rows], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(xs))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([_cell(x) for x in xs])
        if scale_y:
            ax.set_yscale(scale_y)
        else:
            ax.set_ylim(bottom=0)
        ax.set_xlabel(LABELS.get(var_x, var_x))
        ax.set_ylabel(LABELS.get(y, y))
        ax.set_title(LABELS.get(y, y).split(" (")[0])
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].legend(title="Model" if curve_by == "model_id" else curve_by)
    fig.suptitle(title)
    fig.tight_layout()
    fig_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(fig_path, dpi=fig_dpi)
    plt.close(fig)
    return fig_path


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("EXPERIMENT_DIR", help="The directory containing the sweep results "
                        "to plot.")
    parser.add_argument("--fig-dir", default=None,
                        help="Where the figure goes; default: EXPERIMENT_DIR.")
    parser.add_argument("--fig-name", default="FIGURE",
                        help="The figure's file name, without .png.")
    parser.add_argument("--var-x", default="max_concurrency")
    parser.add_argument("--var-y", nargs="+", default=list(DEFAULT_VAR_Y),
                        help="One panel each, side by side.")
    parser.add_argument("--curve-by", default="model_id",
                        help="A curve for each value of this variable.")
    parser.add_argument("--scale-y", default=None, help="e.g. log; default linear from 0.")
    parser.add_argument("--fig-height", type=float, default=4.0)
    parser.add_argument("--fig-dpi", type=int, default=150)
    parser.add_argument("--title", default=None, help="default: the sweep's lengths.")


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        prog="python -m examples.bench.sweep_plot",
        description="Plot performance curves from parameter sweep results.")
    add_cli_args(parser)
    args = parser.parse_args(argv)
    output_dir = Path(args.EXPERIMENT_DIR)
    if not output_dir.exists():
        raise ValueError(f"No parameter sweep results under {output_dir}")
    records = load_results(output_dir)
    check_vars(records, [args.var_x, args.curve_by, *args.var_y])
    fig_path = Path(args.fig_dir or output_dir) / f"{args.fig_name}.png"
    draw(records, fig_path, var_x=args.var_x, var_y=args.var_y, curve_by=args.curve_by,
         scale_y=args.scale_y, fig_height=args.fig_height, fig_dpi=args.fig_dpi,
         title=args.title or default_title(records))
    print(f"Figure: {fig_path}")
    print(markdown_table(records, args.curve_by, args.var_x))
    return fig_path


if __name__ == "__main__":
    main()

"""The ``report`` page: one self-contained HTML file of a report's figures (see :mod:`.sources`); its charts, tables
and page also draw ``fidelity``'s (:func:`stabletoolbench_mirror.fidelity.metrics.render_html`).

Charts are plain inline SVG written here: horizontal bars, and stacked bars per category.  The
page loads nothing: no script, no external style sheet, font or image, so it reads the same
offline, years later, as it did the day it was written.  Every figure a chart draws is also in a
table beside it, with the numbers as text.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from typing import Any

#: rows drawn in a chart at most (the tables and the JSON have them all)
CHART_ROWS = 25
#: tools listed in the per-tool table
TOOL_ROWS = 100
WIDTH = 760
LABEL_W = 280
ROW_H = 22
PALETTE = {
    "frozen_cache": "#4c78a8", "frozen": "#4c78a8", "hits": "#4c78a8",
    "store": "#72b7b2", "imported": "#72b7b2", "answer": "#72b7b2",
    "real": "#54a24b", "recorded": "#f58518", "simulated": "#f58518", "real_or_simulated": "#e4a23a",
    "shared": "#ffbf79", "replaced": "#9d755d",
    "local": "#b279a2", "failure": "#e45756", "failed": "#e45756", "unanswered": "#ff9d98", "unrecorded": "#bab0ac",
    "not_served": "#79706e", "rejected": "#79706e", "refused": "#a0a0a0", "store_errors": "#5a5a5a", "errors": "#333333",
    "fault": "#8e44ad",
}
_OTHER_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#9d755d", "#bab0ac", "#eeca3b", "#ff9da6")
LABELS = {
    "frozen_cache": "frozen cache", "store": "store", "real": "real API", "simulated": "simulator",
    "real_or_simulated": "real API or simulator", "local": "local tool", "failure": "failure", "not_served": "not served",
    "imported": "imported", "frozen": "frozen cache", "answer": "answer", "mcp": "live MCP server",
}

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:2rem auto;max-width:62rem;
padding:0 1rem;color:#222;line-height:1.45}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:2.2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
.meta{color:#555;font-size:.9rem}.cite{background:#f4f6f8;border-left:4px solid #4c78a8;padding:.6rem 1rem;margin:1rem 0}
code,.hash{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.88rem}.hash{word-break:break-all}
table{border-collapse:collapse;margin:.6rem 0 1rem;font-size:.9rem}th,td{padding:.2rem .7rem;border-bottom:1px solid #eee;
text-align:left;vertical-align:top}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.note{color:#666;font-size:.85rem}svg{display:block;margin:.4rem 0;max-width:100%;height:auto}
.big{font-size:1.4rem;font-weight:600}
.alert{background:#fdecea;border-left:4px solid #e45756;padding:.6rem 1rem;margin:1rem 0}
.ok{background:#edf7ed;border-left:4px solid #54a24b;padding:.6rem 1rem;margin:1rem 0}
"""
NAME_BREAKS = re.compile(r"([_\-./])")
"""Where a name (a label, a group, a bundle's path) may break across lines: after ``_ - . /``, never inside a word (hashes,
which have no words, may break anywhere: ``.hash``)."""


NOT_RECORDED = "not recorded"
"""What the page says where its source kept no value (never ``-``, ``None`` or ``unknown``)."""


class Markup(str):
    """HTML already escaped, put in a table cell as it is (:func:`name`)."""


def name(value: Any) -> Markup:
    """``value`` escaped, with a line-break opportunity (``<wbr>``) after each ``_ - . /`` (:data:`NAME_BREAKS`)."""
    return Markup(NAME_BREAKS.sub(r"\1<wbr>", esc(value)))


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def label(name: str) -> str:
    return LABELS.get(name, name)


def colour(name: str, index: int = 0) -> str:
    return PALETTE.get(name) or _OTHER_COLOURS[index % len(_OTHER_COLOURS)]


def number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}"
    return f"{value:,}" if isinstance(value, int) else esc(value)


def percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


# -- charts ---------------------------------------------------------------------------------------


def bar_chart(chart_id: str, title: str, rows: Sequence[tuple[str, float, str]], *, unit: str = "", decimals: int = 3) -> str:
    """Horizontal bars, one per ``(label, value, colour)`` with a value above 0, largest scale first."""
    drawn = [row for row in rows if row[1] > 0][:CHART_ROWS]
    if not drawn:
        return f'<p class="note" id="{esc(chart_id)}-empty">{esc(title)}: nothing to draw.</p>'
    top = max(value for _, value, _ in drawn)
    span = WIDTH - LABEL_W - 90
    height = ROW_H * len(drawn) + 8
    parts = [f'<svg id="{esc(chart_id)}" class="chart" role="img" aria-label="{esc(title)}" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" xmlns="http://www.w3.org/2000/svg"><title>{esc(title)}</title>']
    for i, (name, value, fill) in enumerate(drawn):
        y = 4 + i * ROW_H
        width = max(span * value / top, 1.0)
        shown = f"{value:,.{decimals}f}{unit}" if isinstance(value, float) and not float(value).is_integer() else f"{int(value):,}{unit}"
        parts.append(f'<text x="{LABEL_W - 6}" y="{y + 15}" text-anchor="end" font-size="12">{esc(_clip(name))}</text>')
        parts.append(f'<rect class="bar" x="{LABEL_W}" y="{y + 2}" width="{width:.2f}" height="{ROW_H - 6}" fill="{fill}">'
                     f'<title>{esc(name)}: {esc(shown)}</title></rect>')
        parts.append(f'<text x="{LABEL_W + width + 5:.2f}" y="{y + 15}" font-size="12">{esc(shown)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def stacked_chart(chart_id: str, title: str, table: dict[str, dict[str, int]], columns: Sequence[str]) -> str:
    """One bar per row of ``table`` (its ``total`` long), in segments per column; a legend above."""
    rows = [(name, counts) for name, counts in table.items() if counts.get("total", 0) > 0][:CHART_ROWS]
    if not rows:
        return f'<p class="note" id="{esc(chart_id)}-empty">{esc(title)}: nothing to draw.</p>'
    top = max(counts["total"] for _, counts in rows)
    span = WIDTH - LABEL_W - 70
    legend_h = 24
    height = legend_h + ROW_H * len(rows) + 8
    parts = [f'<svg id="{esc(chart_id)}" class="chart" role="img" aria-label="{esc(title)}" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" xmlns="http://www.w3.org/2000/svg"><title>{esc(title)}</title>']
    x = 4.0
    for i, column in enumerate(columns):
        parts.append(f'<rect x="{x:.0f}" y="4" width="12" height="12" fill="{colour(column, i)}"/>'
                     f'<text x="{x + 16:.0f}" y="14" font-size="12">{esc(label(column))}</text>')
        x += 30 + 7 * len(label(column))
    for r, (name, counts) in enumerate(rows):
        y = legend_h + r * ROW_H
        parts.append(f'<text x="{LABEL_W - 6}" y="{y + 15}" text-anchor="end" font-size="12">{esc(_clip(name))}</text>')
        left = float(LABEL_W)
        for i, column in enumerate(columns):
            n = counts.get(column, 0)
            if n <= 0:
                continue
            width = max(span * n / top, 1.0)
            parts.append(f'<rect class="bar" x="{left:.2f}" y="{y + 2}" width="{width:.2f}" height="{ROW_H - 6}" '
                         f'fill="{colour(column, i)}"><title>{esc(name)}: {esc(label(column))} {n:,}</title></rect>')
            left += width
        parts.append(f'<text x="{left + 5:.2f}" y="{y + 15}" font-size="12">{counts["total"]:,}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _clip(text: str, n: int = 36) -> str:
    """A label that fits left of the bars: its end (the tool and API of a long path), after an ellipsis."""
    return text if len(text) <= n else "…" + text[-(n - 1):]


# -- tables ---------------------------------------------------------------------------------------


def table(table_id: str, head: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Sequence[bool]) -> str:
    cells = "".join(f'<th class="n">{esc(h)}</th>' if n else f"<th>{esc(h)}</th>" for h, n in zip(head, numeric))
    body = []
    for row in rows:
        tds = "".join(f'<td class="n">{number(v)}</td>' if n else f"<td>{v if isinstance(v, Markup) else esc(v)}</td>"
                      for v, n in zip(row, numeric))
        body.append(f"<tr>{tds}</tr>")
    return f'<table id="{esc(table_id)}"><thead><tr>{cells}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def count_table(table_id: str, head: str, counts: dict[str, int], whole: int | None = None, names: dict[str, str] | None = None) -> str:
    total = whole if whole is not None else sum(counts.values())
    rows = [((names or {}).get(k, k), v, percent(v, total)) for k, v in counts.items()]
    return table(table_id, (head, "count", "share"), rows, (False, True, True))


def nested_table(table_id: str, head: str, data: dict[str, dict[str, int]], columns: Sequence[str], limit: int | None = None) -> str:
    items = list(data.items())[:limit] if limit else list(data.items())
    rows = [(name, *(counts.get(c, 0) for c in columns), counts.get("total", 0)) for name, counts in items]
    return table(table_id, (head, *(label(c) for c in columns), "total"), rows, (False, *(True for _ in columns), True))


def columns_of(data: dict[str, dict[str, int]], order: Sequence[str]) -> list[str]:
    present = {c for counts in data.values() for c, n in counts.items() if c != "total" and n}
    return [c for c in order if c in present] + sorted(present - set(order))


# -- sections -------------------------------------------------------------------------------------


def _header(report: dict[str, Any]) -> str:
    source = report["source"]
    env = report.get("environment")
    out = [f"<h1>Run report: {esc(source['kind'])}</h1>",
           f'<p class="meta">Source: <code id="source">{esc(source["location"])}</code><br>'
           f"Written {esc(report['created_at'])} by {esc(report['created_by'])}.</p>"]
    if env:
        out.append(
            '<div class="cite"><b>Environment</b>: snapshot content hash '
            f'<span class="hash" id="content-hash">{esc(env["content_hash"])}</span><br>'
            f"{number(env.get('entries'))} entries in {number(env.get('files'))} files, made {esc(env.get('created_at'))} by "
            f"{esc(env.get('created_by'))} from a {esc(env.get('store'))} store ({esc(env.get('hash_method'))}).<br>"
            "The same hash is the same recorded answers, answer for answer (<code>stabletoolbench-mirror snapshot --verify</code> "
            "recomputes it). It covers what the store recorded (tool answers and model calls), not the frozen caches that "
            "answered beside it: to cite a run's whole environment, cite its score bundle's records hash "
            "(<code>stabletoolbench-mirror report BUNDLE</code>).</div>"
        )
    else:
        out.append('<p class="note" id="no-content-hash">No content hash: only a snapshot (or its archive) has one. '
                   "Make one with <code>stabletoolbench-mirror snapshot OUT</code> and report on it to cite the environment.</p>")
    return "".join(out)


OUTCOME_ORDER = ("hits", "recorded", "shared", "replaced", "unrecorded", "failed", "unanswered", "local",
                 "rejected", "refused", "store_errors", "errors")


def _requests_section(req: dict[str, Any]) -> str:
    total = req["requests"]
    answered = req["answered"]
    faults = sum(req["faults"].values())
    rows = [(label(k), v, colour(k)) for k, v in answered.items()]
    out = ["<h2>How each call was answered</h2>",
           f'<p><span class="big" id="requests-total">{total:,}</span> requests ({req["misses"]:,} missed the cache); '
           f"{faults:,} of them were served an injected fault in place of their answer.</p>",
           bar_chart("chart-answered", "Requests by what answered them", rows + ([("fault (in place of the answer)", faults, colour("fault"))] if faults else [])),
           count_table("answered", "answered by", answered, total, {k: label(k) for k in answered}),
           "<p class=\"note\">From <code>/stats</code>: the frozen cache's hits are its <code>by_source.frozen</code>, the store's the "
           "other hits; new answers are the requests recorded, shared, replaced or served unrecorded; failure is failed and "
           "unanswered; not served is rejected, refused and errors.</p>",
           "<h3>Outcomes</h3>", count_table("outcomes", "outcome", req["outcomes"], total),
           "<h3>Answers by source</h3>",
           count_table("by-source", "source", req["by_source"], total),
           f'<p>Failure records written: <span id="failure-records">{req["failure_records"]:,}</span>; failure records served '
           f'again: {req["failure_hits"]:,}; tried again: {req["retries"]:,}.</p>']
    return "".join(out)


def _simulator_prompt(req: dict[str, Any]) -> str:
    prompt = req.get("simulator_prompt")
    share = req["simulated_share"]
    text = (f'<p>Simulated share of the tool calls: <span class="big" id="simulated-share">{100 * share:.1f}%</span> '
            "(of the <code>/virtual</code> requests; model calls are not counted in it).</p>")
    if prompt:
        text += table("simulator-prompt", ("style", "prompt source", "prompt sha256"),
                      [(prompt.get("style"), prompt.get("source"), prompt.get("sha256"))], (False, False, False))
    else:
        text += '<p class="note">The server runs no simulator.</p>'
    return "<h2>Simulated answers</h2>" + text


def _per_group(data: dict[str, dict[str, int]], order: Sequence[str], what: str, kind: str) -> str:
    columns = columns_of(data, order)
    by_category = data if kind == "category" else {}
    out = []
    if by_category:
        out.append(stacked_chart("chart-by-category", f"{what} per category", by_category, columns))
        out.append(nested_table("by-category", "category", by_category, columns))
    else:
        shown = min(len(data), TOOL_ROWS)
        out.append(f'<p class="note">The {shown:,} tools of most {what.lower()} of {len(data):,} (the JSON has them all).</p>')
        out.append(nested_table("by-tool", "tool", data, columns, TOOL_ROWS))
    return "".join(out)


def _records_section(rec: dict[str, Any], kind: str) -> str:
    total = rec["entries"]
    by_source = rec["by_source"]
    rows = [(label(k), v, colour(k, i)) for i, (k, v) in enumerate(by_source.items())]
    what = "Tool answers in the store" if kind == "store" else "Tool answers of the snapshot"
    out = [f"<h2>{what}</h2>",
           f'<p><span class="big" id="entries-total">{total:,}</span> tool answers, '
           f'<span id="failures-total">{rec["failures"]:,}</span> of them failure records. Model calls are not tool '
           "answers: they are counted under <i>Model calls</i>.</p>",
           bar_chart("chart-by-source", "Entries by source", rows),
           count_table("by-source", "source", by_source, total, {k: label(k) for k in by_source}),
           '<p class="note">A record\'s source as <code>cache stats</code> names it: <code>imported</code> (copied in by '
           "<code>cache import</code>), <code>simulated</code>, <code>real</code> (the real API), <code>local</code> (a local tool). "
           "Failure records are counted under the source that failed too.</p>"]
    sim = rec["simulated"]
    out.append("<h2>Simulated answers</h2>")
    out.append(f'<p>Simulated share of the tool answers: <span class="big" id="simulated-share">{100 * sim["share"]:.1f}%</span> '
               f"({sim['entries']:,} of {total:,}).</p>")
    if sim["by_model"]:
        model_rows: list[tuple[Any, ...]] = [
            (r["origin"], r["model"] or NOT_RECORDED, r["prompt_sha256"] or NOT_RECORDED, r["entries"],
             NOT_RECORDED if r["failures"] is None else r["failures"])
            for r in sim["by_model"]
        ]
        out.append(table("by-model", ("origin", "model", "prompt sha256", "entries", "of them failure records"), model_rows,
                         (False, False, False, True, True)))
    if kind == "bundle":
        out.append('<p class="note">The simulator\'s model, style and prompt hash are under <i>Settings that shaped the '
                   "answers</i>; the records keep the model (origin) of each answer.</p>")
    elif kind != "store":
        out.append('<p class="note">A snapshot keeps the models (origins) of its answers, not each generation\'s prompt hash, '
                   "tokens or latency: report on the store it was made from for those.</p>")
    return "".join(out)


def failures_and_faults(report: dict[str, Any]) -> str:
    req, rec = report.get("requests"), report.get("records")
    out = ["<h2>Failures by cause</h2>"]
    causes = (req or {}).get("failures") or (rec or {}).get("failure_reasons") or {}
    if causes:
        out.append(bar_chart("chart-failures", "Failures by cause", [(k, v, colour("failure")) for k, v in causes.items()]))
        out.append(count_table("failures", "cause", causes))
        if req:
            out.append('<p class="note">Per responder call that gave no usable answer (<code>/stats</code> <code>failures</code>).</p>')
    else:
        out.append('<p id="failures-none">No failures recorded.</p>')
    if req is not None:
        out.append("<h2>Faults served</h2>")
        faults = req["faults"]
        if faults:
            out.append(bar_chart("chart-faults", "Injected faults served, by kind", [(k, v, colour("fault")) for k, v in faults.items()]))
            out.append(count_table("faults", "kind", faults))
        else:
            out.append('<p id="faults-none">No injected faults were served (<code>faults.rate</code> 0).</p>')
    return "".join(out)


def models_section(models: dict[str, Any] | None, kind: str) -> str:
    """The agent's and the judge's model calls (``@model/<model>/<endpoint>`` records, or ``/stats`` ``model_calls``)."""
    out = ["<h2>Model calls</h2>"]
    rows = (models or {}).get("models") or []
    if not rows:
        out.append('<p class="note" id="models-none">No model calls in this source (the agent\'s and the judge\'s calls '
                   "through <code>/v1</code> are recorded under <code>@model/</code>).</p>")
        return "".join(out)
    served = kind == "server"
    out.append(f'<p><span class="big" id="model-calls-total">{models["calls"]:,}</span> model calls; '  # type: ignore[index]
               f'{models["prompt_tokens"]:,} prompt and {models["completion_tokens"]:,} completion tokens'  # type: ignore[index]
               f'{" spent upstream in this run" if served else " in their recorded usage"}.</p>')
    out.append(bar_chart("chart-model-tokens", "Tokens per model (prompt + completion)",
                         [(r["model"], r["prompt_tokens"] + r["completion_tokens"], colour("", i)) for i, r in enumerate(rows)]))
    head = ("model", "role", "endpoint", "calls", "distinct requests", "prompt tokens", "completion tokens")
    body = [(r["model"], ", ".join(r["roles"]) or "-", r["endpoint"] or "-", r["calls"],
             "-" if r["distinct_requests"] is None else r["distinct_requests"], r["prompt_tokens"], r["completion_tokens"])
            for r in rows]
    out.append(table("models", head, body, (False, False, False, True, True, True, True)))
    if served:
        outcome_rows = [(r["model"], ", ".join(f"{k} {v:,}" for k, v in (r["outcomes"] or {}).items() if v)) for r in rows]
        out.append(table("model-outcomes", ("model", "outcomes"), outcome_rows, (False, False)))
        out.append('<p class="note">From <code>/stats</code> <code>model_calls</code>: calls are the requests served; tokens '
                   "are those the upstreams were asked for (a recorded answer served again costs none).</p>")
    else:
        out.append('<p class="note">Calls are the recorded occurrences (the n-th identical request of a run gets the n-th); '
                   "distinct requests, the different requests among them; tokens, the sum of each recorded completion's "
                   "<code>usage</code>.</p>")
    return "".join(out)


def _spend_and_latency(rec: dict[str, Any] | None) -> str:
    out = ["<h2>Simulator spend</h2>"]
    tokens = (rec or {}).get("tokens")
    if tokens:
        out.append(table("tokens", ("records with token counts", "prompt tokens", "completion tokens", "total tokens"),
                         [(tokens["records"], tokens["prompt_tokens"], tokens["completion_tokens"], tokens["total_tokens"])],
                         (True, True, True, True)))
    else:
        out.append('<p class="note" id="tokens-none">Not recorded in this source: the simulator\'s token counts are in a '
                   "store's simulated records (their <code>meta</code>); report on the store.</p>")
    out.append("<h2>Slowest APIs</h2>")
    slow = (rec or {}).get("slowest_apis") or []
    if slow:
        out.append(bar_chart("chart-slowest", "Mean latency of a simulated answer, seconds",
                             [(r["api"], float(r["mean_s"]), "#4c78a8") for r in slow], unit=" s"))
        out.append(table("slowest", ("API", "calls", "mean s", "max s"), [(r["api"], r["calls"], r["mean_s"], r["max_s"]) for r in slow],
                         (False, True, True, True)))
    else:
        out.append('<p class="note" id="latency-none">No latency recorded in this source (a store\'s simulated records carry '
                   "<code>meta.latency_s</code>; <code>/stats</code> keeps none).</p>")
    return "".join(out)


RECORD_ORDER = ("imported", "simulated", "real", "local", "answer", "failure")


def records_part(rec: dict[str, Any], kind: str) -> list[str]:
    """The tool answers of a store, snapshot or bundle: by source, simulated share, per category and tool."""
    return [_records_section(rec, kind), "<h2>Per category</h2>", _per_group(rec["by_category"], RECORD_ORDER, "Entries", "category"),
            "<h2>Per tool</h2>", _per_group(rec["by_tool"], RECORD_ORDER, "Entries", "tool")]


#: the latest drift records shown per server (the JSON has every one)
DRIFT_ROWS = 100


def _drift_text(fields: dict[str, list[str]]) -> str:
    return "; ".join(f"{tool}: {', '.join(changed)}" for tool, changed in fields.items()) or "-"


def mcp_section(mcp: dict[str, Any] | None) -> str:
    """The live MCP servers of a report's ``mcp`` part: their listings, calls and drift (every name escaped: a
    server names its own tools)."""
    if not mcp:
        return ""
    servers = mcp["servers"]
    verdict = ("A server's latest drift record says it drifted: its tools or answers are not what the run recorded."
               if mcp["drifted"] else "No server's latest drift record says it drifted.")
    calls = [(server, tool, n) for server, s in servers.items() for tool, n in s["calls_by_tool"].items()]
    return "".join([
        "<h2>Live MCP servers</h2>", f'<p id="mcp-drifted" class="{"alert" if mcp["drifted"] else "ok"}">{esc(verdict)}</p>',
        _mcp_servers(servers), "<h3>Calls per tool</h3>", table("mcp-tools", ("server", "tool", "calls"), calls[:TOOL_ROWS], (False, False, True)),
        "<h3>Drift</h3>", _mcp_drift(servers),
        '<p class="note">A server\'s listing and drift records are not tool answers: only its calls are counted above as tool '
        "answers. Drift is in time order: <code>verify</code> by <code>mcp-verify</code>, <code>record</code> by a record run "
        "that saw the server's tools/list change.</p>"])


def _mcp_servers(servers: dict[str, dict[str, Any]]) -> str:
    columns = list(dict.fromkeys(c for s in servers.values() for c in s["calls_by_source"]))
    rows = [(server, NOT_RECORDED if s["tools_listed"] is None else s["tools_listed"], s["listed_at"] or NOT_RECORDED,
             s["tools_called"], s["calls"], *(s["calls_by_source"].get(c, 0) for c in columns), _verified(s["last_verified"]),
             _drift_state(s))
            for server, s in servers.items()]
    head = ("server", "tools listed", "listed at", "tools called", "calls", *(label(c) for c in columns), "last verified", "drift")
    return table("mcp-servers", head, rows, (False, True, False, True, True, *(True for _ in columns), False, False))


def _drift_state(server: dict[str, Any]) -> str:
    if not server["drift"]:
        return "never measured"
    return "drifted" if server["drifted"] else "unchanged"


def _mcp_drift(servers: dict[str, dict[str, Any]]) -> str:
    rows = [(server, d["seen"], d["at"] or NOT_RECORDED, "drifted" if d["drifted"] else "unchanged", _drift_text(d["schema"]),
             _drift_text(d["answers"]), d["error"] or "-") for server, s in servers.items() for d in s["drift"][-DRIFT_ROWS:]]
    if not rows:
        return ('<p class="note" id="mcp-drift-none">No drift measured: <code>stabletoolbench-mirror mcp-verify</code> asks the '
                "servers again and keeps what it finds.</p>")
    return table("mcp-drift", ("server", "seen by", "at", "drifted", "schema changed", "answers differ", "error"), rows, (False,) * 7)


def _verified(last: dict[str, Any] | None) -> str:
    if last is None:
        return "never"
    return f"{last['at'] or NOT_RECORDED}: {'drifted' if last['drifted'] else 'unchanged'}"


def render_run(report: dict[str, Any]) -> str:
    """The page of a store's, snapshot's or server's report (what :func:`.sources.collect` returns for one)."""
    kind = report["source"]["kind"]
    parts = [_header(report)]
    req, rec = report.get("requests"), report.get("records")
    if req is not None:
        parts += [_requests_section(req), _simulator_prompt(req), "<h2>Per category</h2>",
                  _per_group(req["by_category"], OUTCOME_ORDER, "Requests", "category"),
                  "<h2>Per tool</h2>", _per_group(req["by_tool"], OUTCOME_ORDER, "Requests", "tool")]
    if rec is not None:
        parts += records_part(rec, kind)
    parts += [mcp_section(report.get("mcp")), models_section(report.get("models"), kind), failures_and_faults(report), _spend_and_latency(rec)]
    return page(f"stabletoolbench-mirror report: {kind}", parts)


#: the last line of a report's page
REPORT_NOTE = ('The same figures as JSON: <code>stabletoolbench-mirror report SOURCE --json</code> (or '
               "<code>--json-out FILE</code>); what each one means: docs/report.md of stabletoolbench-mirror.")


def page(title: str, parts: list[str], *, note: str = REPORT_NOTE) -> str:
    """A whole page: ``parts`` in a document that loads nothing from anywhere (its CSP says so to the browser too),
    ``note`` (HTML) last."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        # nothing outside the page may be loaded, whatever a name in it says
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">"
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{esc(title)}</title>'
        f'<style>{CSS}</style></head><body>{"".join(parts)}<p class="note">{note}</p></body></html>\n'
    )

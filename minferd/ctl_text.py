"""How minferctl shows things to a person: bytes, durations, the status and ls tables, the load
progress bar. Plain functions of plain dicts (what minferd.client returns); no gRPC here."""
from __future__ import annotations

import os
import sys
import time

from minferd.client import KINDS
from minferd.units import fmt_bytes


# ---- the pieces of the human output ---------------------------------------------------------
def human_bytes(n: int) -> str:
    return fmt_bytes(n) if n else "-"  # a dash reads faster than "0 B" in a column of zeros


def human_duration(s: float) -> str:
    s = int(max(s, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def keep_alive_text(m: dict) -> str:
    if m["keep_alive_seconds"] < 0:
        return "forever"
    if m["keep_alive_seconds"] == 0:
        return "until idle"
    if m["busy"]:
        return "busy"  # the clock only runs while the model is idle
    left = m["keep_alive_left_seconds"]
    return human_duration(left) if left > 0 else "expired"


def last_used_text(m: dict, now: float) -> str:
    if m["busy"]:
        return "now"
    if m["last_used_unix"] <= 0:
        return "never"
    return human_duration(now - m["last_used_unix"]) + " ago"


def plan_text(m: dict) -> str:
    """The path now; * demoted (planned w16), ^ waits for room for an f16 copy it never had."""
    demoted = m["planned_matmul_path"] == "w16" and m["matmul_path"] != "w16"
    return m["matmul_path"] + ("*" if demoted else "^" if m.get("waiting_for_w16") else "")


def seqs_text(m: dict) -> str:
    """Sequences running, and waiting after a +."""
    e = m.get("engine") or {}
    return f"{e.get('running', 0)}" + (f"+{e['waiting']}" if e.get("waiting") else "")


def blocks_text(m: dict) -> str:
    """KV blocks held by sequences / all (cached ones count as free: they are reused on demand)."""
    e = m.get("engine") or {}
    return f"{e.get('blocks_used', 0)}/{e.get('blocks_total', 0)}"


def status_table(st: dict, now: float | None = None) -> str:
    now = time.time() if now is None else now
    head = ("NAME", "PATH", "PLAN", "WEIGHTS", "W16", "KV", "SCRATCH", "CTX", "SEQS", "BLOCKS", "PINNED",
            "KEEP-ALIVE", "LAST USED", "REQS", "TOKENS")
    rows = [(m["name"], os.path.basename(m["path"]), plan_text(m), *(human_bytes(m["bytes"][k]) for k in KINDS),
             str(m["ctx"]), seqs_text(m), blocks_text(m), "yes" if m["pinned"] else "-", keep_alive_text(m), last_used_text(m, now),
             str(m["requests"]), str(m["tokens_generated"])) for m in st["models"]]
    right = {"WEIGHTS", "W16", "KV", "SCRATCH", "CTX", "SEQS", "BLOCKS", "REQS", "TOKENS"}  # numbers line up on the right
    pools = st.get("pools") or [st["pool"]]
    if len(pools) > 1:  # several devices: which one each model lives on
        head = (head[0], "DEVICE", *head[1:])
        rows = [(r[0], m.get("device", ""), *r[1:]) for r, m in zip(rows, st["models"])]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) if head[i] in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in [head, *rows]]
    if not rows:
        lines = ["no models loaded"]
    lines.append("")
    for p in pools:
        used = p["used_bytes"] / p["capacity_bytes"] if p["capacity_bytes"] else 0.0
        bar = "#" * round(used * 20)
        lines.append(f"POOL {p['device']}  [{bar:<20}] {used:.1%} used  capacity {fmt_bytes(p['capacity_bytes'])}  "
                     f"used {fmt_bytes(p['used_bytes'])}  reserved {fmt_bytes(p['reserved_bytes'])}  "
                     f"free {fmt_bytes(p['free_bytes'])}")
    p = st["pool"]
    demoted = [m for m in st["models"] if plan_text(m).endswith("*")]
    if demoted:
        lines.append("* demoted: " + ", ".join(f"{m['name']} planned {m['planned_matmul_path']}" for m in demoted))
    waiting = [m["name"] for m in st["models"] if plan_text(m).endswith("^")]
    if waiting:
        lines.append("^ quantized until its f16 copy fits: " + ", ".join(waiting))
    for m in st["models"]:  # a mixture of experts: which of its classes hold an f16 copy
        if m.get("classes"):
            lines.append(f"{m['name']} f16 copy: " + "; ".join(class_text(c) for c in m["classes"]))
    groups = {tuple(sorted([m["name"], *m["shared_with"]])) for m in st["models"] if m["shared_with"]}
    if groups:  # one copy of the weights: a column sum would count it twice
        lines.append("shared weights: " + "; ".join(" + ".join(g) for g in sorted(groups)))
    for doing in ("loading", "unloading"):
        if p.get(doing):
            lines.append(f"{doing}: " + ", ".join(p[doing]))
    if st["events"]:
        lines.append("recent: " + "; ".join(st["events"][-3:]))
    return "\n".join(lines)


def class_text(c: dict) -> str:
    held = f"copied ({human_bytes(c['f16_copy_bytes'])})" if c["f16_copy_bytes"] else "quantized"
    return f"{c['name']} {human_bytes(c['quantized_bytes'])} {held}" + (f", {c['note']}" if c.get("note") else "")


def footprint_text(m: dict) -> str:
    b = m["bytes"]
    kinds = ", ".join(f"{k} {human_bytes(b[k])}" for k in KINDS)
    return f"{kinds} = {fmt_bytes(sum(b.values()))}; ctx {m['ctx']}"


class ProgressBar:
    """LoadProgress on stderr: one redrawn line per phase on a terminal, a few plain lines in a log."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.shown = None

    def __call__(self, phase: str, done: int, total: int) -> None:
        frac = done / total if total else 1.0
        line = f"{phase:<8} [{'#' * int(frac * 24):<24}] {frac:6.1%}"
        if not total:  # a phase without bytes (planning) has nothing to fill
            line = f"{phase:<8} ..."
        elif total > 1:
            line += f"  {fmt_bytes(done)} / {fmt_bytes(total)}"
        if self.tty:
            new_phase = self.shown is not None and self.shown[0] != phase
            self.stream.write(("\n" if new_phase else "\r") + line + "\x1b[K")
            self.shown = (phase, 0)
        elif self.shown != (phase, int(frac * 4)):  # a log gets a line per quarter, not per chunk
            self.stream.write(line + "\n")
            self.shown = (phase, int(frac * 4))
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.shown:
            self.stream.write("\n")


def available_table(rows: list[dict]) -> str:
    """`minferctl ls`: a file per line, a refused one with why."""
    head = ("NAME", "SIZE", "ARCH", "PLAN", "WOULD TAKE", "FITS", "LOADED")
    table = [head] + [(r["name"], human_bytes(r["file_bytes"]), "-", "refused: " + r["error"], "", "", "")
                      if "error" in r else
                      (r["name"], human_bytes(r["file_bytes"]), r["architecture"], r["plan"],
                       human_bytes(sum(r["bytes"].values())), "yes" if r["fits"] else "no",
                       "yes" if r["loaded"] else "-") for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(len(head))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip() for t in table)
    return text if rows else "no .gguf files in the daemon's --models-dir"

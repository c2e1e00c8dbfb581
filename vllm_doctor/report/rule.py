"""One check explained as text: what ``vllm-doctor rule CODE`` prints and the TUI's finding details show."""

from __future__ import annotations

from vllm_doctor.model import CheckMeta


def render_rule(meta: CheckMeta) -> str:
    """The check's code, name, severity and stage, summary, then What / Why it hurts / Example / Fix / References."""
    e = meta.explanation
    parts = [
        f"{meta.code} {meta.name} ({meta.severity_text}, {meta.stage.value} stage)\n\n{meta.summary}\n",
        f"What\n  {e.what}\n\nWhy it hurts\n  {e.why}\n\nExample\n"
        + "\n".join("  " + line for line in e.example.splitlines()),
        "\nFix\n" + "\n".join("  " + line for line in e.fix.splitlines()),
    ]
    if e.references:
        parts.append("\nReferences\n" + "\n".join(f"  {r}" for r in e.references))
    return "\n".join(parts)

"""A notebook's answer at a glance: the question it asks, the headline number with its
uncertainty, and the caveat. ``headline(...)`` shows it in the notebook and records it under
``HEADLINE_MIME`` so that ``workbench.report`` puts it on the report index."""

from __future__ import annotations

import html

HEADLINE_MIME = "application/vnd.workbench.headline+json"


def headline_bundle(question: str, value: str, caveat: str, uncertainty: str | None = None) -> dict:
    for name, text in (("question", question), ("value", value), ("caveat", caveat)):
        if not str(text or "").strip():
            raise ValueError(f"headline needs a non-empty {name}")
    rec = {"question": str(question), "value": str(value), "uncertainty": uncertainty and str(uncertainty),
           "caveat": str(caveat)}
    unc = f" <span style='color:#555'>({html.escape(rec['uncertainty'])})</span>" if rec["uncertainty"] else ""
    body = (f"<div class='wb-headline' style='border-left:4px solid #4e79a7;padding:6px 12px;margin:8px 0'>"
            f"<div><b>Question.</b> {html.escape(rec['question'])}</div>"
            f"<div style='font-size:1.3em;margin:4px 0'><b>{html.escape(rec['value'])}</b>{unc}</div>"
            f"<div><b>Caveat.</b> {html.escape(rec['caveat'])}</div></div>")
    text = f"Q: {rec['question']}\n{rec['value']}" + (f" ({rec['uncertainty']})" if rec["uncertainty"] else "") \
        + f"\nCaveat: {rec['caveat']}"
    return {"text/html": body, "text/plain": text, HEADLINE_MIME: rec}


def headline(question: str, value: str, caveat: str, uncertainty: str | None = None) -> None:
    """Display the headline and record it for the report (the last one in a notebook wins)."""
    from IPython.display import display

    display(headline_bundle(question, value, caveat, uncertainty), raw=True)

// A running run's page follows it: each new timeline row the server sends (server-sent events
// from /api/v1/runs/RUN/events) is appended to the list, built from text nodes only: nothing an
// agent or a tool wrote is ever parsed as HTML. When the run ends, its status is shown.
"use strict";
(function () {
  const list = document.querySelector("ol.timeline[data-events]");
  if (!list || !window.EventSource) {
    return;
  }
  const source = new EventSource(list.dataset.events);

  // Bidi controls (U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069: schemas.shown's
  // BIDI_CODES) shown as markers, as the server's pages show them (schemas.shown.neutral_bidi):
  // untrusted text cannot display reversed.
  function neutral(value) {
    return String(value).replace(/[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g, function (c) {
      return "[U+" + c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0") + "]";
    });
  }

  function text(tag, className, value) {
    const node = document.createElement(tag);
    node.className = className;
    node.textContent = neutral(value);
    return node;
  }

  // The pages' rule (consumers.analytics.money): four decimals; an amount above 0 too small for
  // them shows its first two significant digits ($0.000014), never $0.0000.
  function usd(value) {
    if (value === null || value === undefined) {
      return "unknown";
    }
    const amount = Number(value);
    const size = Math.abs(amount);
    const places = size > 0 && size < 0.0001 ? Math.min(20, 1 - Math.floor(Math.log10(size))) : 4;
    return "$" + amount.toLocaleString("en-US", {minimumFractionDigits: places, maximumFractionDigits: places});
  }

  source.addEventListener("row", function (event) {
    const row = JSON.parse(event.data);
    const item = document.createElement("li");
    item.className = "live";
    const details = document.createElement("details");
    const summary = document.createElement("summary");
    summary.append(
      text("span", "seq", "#" + row.seq), " ",
      text("span", "at", row.occurred_at), " ",
      text("span", "kind", row.kind), " ",
      text("span", "rstatus", row.status || ""), " ",
      text("span", "summary", row.summary), " ",
      text("span", "sofar", "cost so far " + usd(row.cost_so_far_usd))
    );
    const drill = document.createElement("div");
    drill.className = "drill";
    const link = document.createElement("a");
    link.href = list.dataset.run + "/entries/" + encodeURIComponent(row.seq);
    link.textContent = neutral("Open entry #" + row.seq);
    const para = document.createElement("p");
    para.append(link);
    drill.append(para, text("pre", "text", row.text), text("pre", "json", JSON.stringify(row, null, 2)));
    details.append(summary, drill);
    item.append(details);
    list.append(item);
    const count = document.querySelector("[data-row-count]");
    if (count) {
      count.textContent = String(Number(count.textContent) + 1);
    }
  });

  // the token was revoked or has expired: the server ended the stream; do not reconnect
  source.addEventListener("denied", function () {
    source.close();
  });

  source.addEventListener("end", function (event) {
    source.close();
    const status = document.querySelector("dd.status");
    if (status) {
      status.textContent = JSON.parse(event.data).status;
    }
  });
})();

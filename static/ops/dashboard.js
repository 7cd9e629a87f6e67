// The operator dashboard: renders each "state" frame of /ws/ops/dashboard (workbench/ops/consumers.py)
// and sends flag changes, operators' cancels of requests and their picks for the replay audit. Everything
// that comes from users (request ids, user names) is set as text, never as HTML. Leak events and replay
// checks are kept here across frames, since a frame carries only the latest ones.
"use strict";

(() => {
  const root = document.getElementById("dashboard");
  const mayFlip = root.dataset.mayFlip === "true";
  const connection = document.getElementById("connection");
  const replays = new Map();  // "worker@engine run" -> Map(replay number -> check); numbers restart per run
  const leaks = new Map();    // "engine run:number" -> event with its worker
  const KEEP_REPLAYS = 400, KEEP_LEAKS = 200;
  let socket = null, nextId = 1, shownFlags = "";

  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs)) {
      if (name === "text") node.textContent = value;
      else if (name === "class") node.className = value;
      else node.setAttribute(name, value);
    }
    children.forEach((child) => node.append(child));
    return node;
  }

  function fill(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  // -- workers ------------------------------------------------------------------------------------

  function deviceLoopText(loop) {
    if (!loop) return "unknown";
    const engaged = loop.engaged ? "engaged" : loop.enabled ? "not engaged" : "off (host decode)";
    const armed = loop.killed ? `killed: ${loop.kill_reason}` : "armed";
    return `${engaged}; ${armed}; burst ${loop.burst_length}, generation ${loop.generation}, ${loop.bursts} bursts`;
  }

  function prefixCacheText(cache) {
    if (!cache) return "unknown";
    if (!cache.enabled) return "off";
    const rate = cache.hit_rate === null ? "no prompts yet" :
      `hit rate ${Math.round(cache.hit_rate * 100)}% (${cache.hits} of ${cache.queries} prompt tokens)`;
    return `on, scope ${cache.scope}; ${Math.round(cache.usage * 100)}% of KV blocks cached; ${rate}`;
  }

  function routeText(route) {
    if (!route) return "-";
    // The replay audit compares bits on an invariant route (a difference is a leak event), distances elsewhere.
    return `${route.route}: ${route.invariant ? "bit-invariant" : "not bit-invariant (the audit reports distances)"}`;
  }

  function renderWorkers(workers) {
    const cards = Object.entries(workers).map(([id, w]) => {
      const state = w.state || {};
      const loop = state.device_loop, capture = state.capture || {};
      return el("article", {class: "worker", "data-worker": id},
        el("h3", {text: id}),
        el("dl", {},
          el("dt", {text: "device / model"}), el("dd", {text: `${w.device} / ${w.model}`}),
          el("dt", {text: "requests"}), el("dd", {text: `${w.running} running, ${w.waiting} waiting${w.draining ? ", draining" : ""}`}),
          el("dt", {text: "device loop"}), el("dd", {class: "device-loop", "data-engaged": String(!!(loop && loop.engaged)), text: deviceLoopText(loop)}),
          el("dt", {text: "parked / dropped"}), el("dd", {text: loop ? `${loop.parked} parked, ${loop.foreign_dropped} foreign dropped` : "-"}),
          el("dt", {text: "prefix cache"}), el("dd", {class: "prefix-cache", text: prefixCacheText(state.prefix_cache)}),
          el("dt", {text: "route"}), el("dd", {class: "route", "data-invariant": String(!!(state.route && state.route.invariant)), text: routeText(state.route)}),
          el("dt", {text: "capture"}), el("dd", {class: "capture", "data-mode": capture.mode || "", text: `${capture.mode || "?"}: ${capture.reason || ""}`}),
          el("dt", {text: "graphs"}), el("dd", {text: `${capture.graphs ? "on" : "off"}, ${capture.replays || 0} replays`}),
          ...(w.heartbeat_age_s === undefined ? [] : [el("dt", {text: "heartbeat"}), el("dd", {text: `${w.heartbeat_age_s} s ago`})]),
          ...(state.error ? [el("dt", {text: "snapshot"}), el("dd", {class: "error", text: state.error})] : []),
        ));
    });
    document.getElementById("workers").replaceChildren(...cards);
  }

  // -- flags --------------------------------------------------------------------------------------

  function renderFlags(flags, workerIds) {
    // Redrawn only when something changed, so a button is not swapped out under the operator's click
    // and a number being typed is not wiped.
    const key = JSON.stringify([flags, workerIds]);
    if (key === shownFlags) return;
    shownFlags = key;
    const table = document.getElementById("flags");
    table.tHead.replaceChildren(el("tr", {}, el("th", {text: "flag"}), ...workerIds.map((id) => el("th", {text: id})),
                                   ...(mayFlip ? [el("th", {text: "all workers"})] : [])));
    fill(table.tBodies[0], flags.map((flag) => {
      const cells = workerIds.map((id) => {
        const value = flag.in_force[id];
        const cell = el("td", {"data-worker": id, "data-value": String(value)}, el("span", {class: "value", text: String(value)}));
        if (mayFlip) cell.append(control(flag, id, value));
        return cell;
      });
      if (mayFlip) cells.push(el("td", {}, control(flag, null, undefined)));
      return el("tr", {"data-flag": flag.name},
        el("th", {}, el("code", {text: flag.name}), el("small", {text: flag.description + (flag.settable ? "" : " (fixed at start)")})),
        ...cells);
    }));
  }

  function control(flag, worker, value) {
    const target = worker === null ? "all workers" : worker;
    if (flag.kind === "int") {
      const input = el("input", {type: "number", min: "0", step: "1", "data-flag": flag.name, "data-worker": worker || "", "aria-label": `${flag.name} on ${target}`});
      const button = el("button", {type: "button", class: "set", "data-flag": flag.name, "data-worker": worker || "", text: "set"});
      button.addEventListener("click", () => {
        const number = Number(input.value);
        if (input.value === "" || !Number.isInteger(number) || number < 0) return show({error: `${flag.name} takes a whole number >= 0`});
        send(flag.name, number, worker);
      });
      return el("span", {class: "int-control"}, input, button);
    }
    if (worker === null) {
      return el("span", {}, ...[true, false].map((v) => {
        const b = el("button", {type: "button", class: "flip", "data-flag": flag.name, "data-worker": "", "data-value": String(v), text: v ? "all on" : "all off"});
        b.addEventListener("click", () => send(flag.name, v, null));
        return b;
      }));
    }
    const next = !value;
    const button = el("button", {type: "button", class: "flip", "data-flag": flag.name, "data-worker": worker, "data-value": String(next), text: value ? "turn off" : "turn on"});
    button.addEventListener("click", () => send(flag.name, next, worker));
    return button;
  }

  // An operator's action on one request ("cancel" or "audit"): a `<action>_request` frame naming it.
  function requestButton(action, worker, requestId) {
    const button = el("button", {type: "button", class: `${action}-request`, "data-worker": worker, "data-request": requestId, text: action});
    button.addEventListener("click", () => {
      if (!socket || socket.readyState !== WebSocket.OPEN) return show({error: "not connected"});
      socket.send(JSON.stringify({type: `${action}_request`, id: nextId++, worker, request_id: requestId}));
    });
    return button;
  }

  function send(name, value, worker) {
    if (!socket || socket.readyState !== WebSocket.OPEN) return show({error: "not connected"});
    const frame = {type: "set_flag", id: nextId++, name, value};
    if (worker !== null) frame.worker = worker;
    socket.send(JSON.stringify(frame));
  }

  function show(answer) {
    const box = document.getElementById("flag-answer");
    box.hidden = false;
    const refused = answer.error || Object.values(answer).some((a) => a && a.error);
    box.dataset.kind = refused ? "error" : "answer";
    box.textContent = JSON.stringify(answer, null, 2);
  }

  function renderChanges(changes) {
    fill(document.querySelector("#changes tbody"), changes.length ? changes.map((c) =>
      el("tr", {"data-change": String(c.id), class: c.refused_by.length ? "mismatch" : ""},
        el("td", {text: new Date(c.at).toLocaleString()}), el("td", {class: "who", text: c.user}),
        el("td", {}, el("code", {text: c.name})), el("td", {text: JSON.stringify(c.value)}),
        el("td", {text: c.workers}), el("td", {text: c.refused_by.join(", ") || "-"}))) :
      [el("tr", {}, el("td", {colspan: "6", class: "note", text: "no changes yet"}))]);
  }

  // -- sequences and parked slots -----------------------------------------------------------------

  function renderSequences(workers) {
    const rows = [], slots = [];
    for (const [id, w] of Object.entries(workers)) {
      const state = w.state || {};
      if (state.sequences === null && state.sequence_count) {
        // A Celery worker sends its list only while a dashboard is open: it arrives with its next heartbeat.
        rows.push(el("tr", {"data-worker": id}, el("td", {text: id}),
          el("td", {colspan: "10", class: "note", text: `${state.sequence_count} live sequences; their list comes with the worker's next heartbeat`})));
      }
      for (const s of state.sequences || []) {
        const matches = s.owner_matches;
        rows.push(el("tr", {"data-request": s.request_id, "data-worker": id, class: matches ? "" : "mismatch"},
          el("td", {text: id}), el("td", {text: s.request_id}), el("td", {text: String(s.seq_id)}),
          el("td", {class: "user", text: s.user || "-"}),
          el("td", {class: "state", text: s.state + (s.waitlisted ? " (waitlisted)" : "")}),
          el("td", {class: "tokens", text: `${s.tokens} / ${s.max_tokens}`}),
          el("td", {text: s.row === null ? "-" : String(s.row)}), el("td", {class: "parked", text: String(s.parked)}),
          el("td", {text: s.slot_owner === null ? "-" : String(s.slot_owner)}),
          el("td", {class: "owner-matches", text: matches ? "yes" : "NO: foreign slot, dropped when taken"}),
          el("td", {}, requestButton("cancel", id, s.request_id), requestButton("audit", id, s.request_id))));
      }
      for (const slot of state.parked_slots || []) {
        slots.push(el("tr", {class: slot.owner_live ? "" : "mismatch"},
          el("td", {text: id}), el("td", {text: String(slot.row)}), el("td", {text: String(slot.owner)}),
          el("td", {text: String(slot.tokens)}), el("td", {text: slot.owner_live ? "yes" : "no"})));
      }
    }
    fill(document.querySelector("#sequences tbody"), rows.length ? rows : [el("tr", {}, el("td", {colspan: "11", class: "note", text: "no live sequences"}))]);
    fill(document.querySelector("#parked tbody"), slots.length ? slots : [el("tr", {}, el("td", {colspan: "5", class: "note", text: "nothing parked"}))]);
  }

  // -- leak events and replay verification --------------------------------------------------------

  function collect(workers) {
    for (const [id, w] of Object.entries(workers)) {
      const state = w.state || {};
      for (const event of state.leak_events || []) leaks.set(`${w.engine_run}:${event.number}`, {...event, worker: id});
      const key = `${id}@${w.engine_run}`;
      const mine = replays.get(key) || new Map();
      for (const check of state.replay_checks || []) {
        if (!mine.has(check.replay)) mine.set(check.replay, {...check, worker: id, seenAt: Date.now()});
      }
      while (mine.size > KEEP_REPLAYS) mine.delete(mine.keys().next().value);
      replays.set(key, mine);
    }
    while (leaks.size > KEEP_LEAKS) leaks.delete(leaks.keys().next().value);
  }

  function renderLeaks() {
    const events = [...leaks.values()].sort((a, b) => b.at - a.at);
    fill(document.getElementById("leak-log"), events.length ? events.map((e) =>
      el("li", {"data-kind": e.kind, "data-dropped": String(e.dropped)},
        el("time", {text: new Date(e.at * 1000).toLocaleTimeString()}), " ",
        el("strong", {text: e.worker}), " ", el("span", {class: "kind", text: e.kind.replaceAll("_", " ")}), ": ",
        el("span", {class: "message", text: e.message}))) : [el("li", {class: "note", text: "none: no foreign parked token and no aliased logits caught"})]);
  }

  function renderReplays() {
    const runs = [...replays.entries()];
    const series = runs.map(([key, checks]) => ({
      name: runs.filter(([k]) => k.split("@")[0] === key.split("@")[0]).length > 1 ? key : key.split("@")[0],
      points: [...checks.values()].filter((c) => c.max_abs_delta !== null)
        .sort((a, b) => a.replay - b.replay).map((c) => [c.replay, c.max_abs_delta])}));
    Charts.lines(document.getElementById("replay-chart"), series, "replay");
    const all = runs.flatMap(([, checks]) => [...checks.values()]);
    const nonFinite = all.filter((c) => c.max_abs_delta === null).length;
    document.getElementById("replay-non-finite").textContent = nonFinite
      ? `${nonFinite} replay(s) with non-finite logits (NaN or inf), not drawn: the worst divergence` : "";
    // The divergent check that reached this page last, whichever worker it came from.
    const latest = all.filter((c) => c.divergent && c.layer_deltas).sort((a, b) => a.seenAt - b.seenAt).pop();
    const caption = document.getElementById("bisect-caption");
    if (latest) {
      caption.textContent = `${latest.worker}, replay ${latest.replay}: first divergent layer ${latest.first_divergent_layer}`;
      Charts.bars(document.getElementById("bisect-chart"), latest.layer_deltas.map((d) => d === null ? Infinity : d),
                  latest.first_divergent_layer, "layer");
    }
  }

  // -- the socket ---------------------------------------------------------------------------------

  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(`${scheme}://${location.host}/ws/ops/dashboard`);
    socket.onopen = () => { connection.dataset.state = "live"; connection.textContent = "live"; };
    socket.onclose = (event) => {
      connection.dataset.state = "closed";
      connection.textContent = `disconnected (${event.code}); reconnecting…`;
      setTimeout(connect, 2000);
    };
    socket.onmessage = (message) => {
      const frame = JSON.parse(message.data);
      if (frame.type === "state") {
        const ids = Object.keys(frame.workers);
        collect(frame.workers);
        renderWorkers(frame.workers);
        renderFlags(frame.flags, ids);
        renderChanges(frame.changes || []);
        renderSequences(frame.workers);
        renderLeaks();
        renderReplays();
      } else if (frame.type === "flag_result") {
        show(frame.answers);
      } else if (frame.type === "cancel_result") {
        show({...(frame.error ? {error: frame.error} : {canceled: true}), audit_log_entry: frame.cancel});
      } else if (frame.type === "audit_result") {
        show(frame.error ? {error: frame.error} : {picked_for_the_replay_audit: true});
      } else if (frame.type === "error") {
        show({error: frame.message, code: frame.code});
      }
    };
  }

  connect();
})();

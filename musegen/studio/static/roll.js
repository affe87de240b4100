// musegen studio: the piano roll, drawn on a canvas from the notes the page holds (studio.js).
// One sample at a time: a lane per track in its instrument's colour, the drums as hits on a lane
// of their own, bar lines where the piece's meters put them, and a window of ticks that the
// wheel and the zoom buttons move (by default the prompt's last bars and the continuation).
"use strict";

// A note is [start, end, pitch, track, drum, velocity]; a track [program, drum, instrument name];
// a meter [tick, numerator, denominator] (the server's jobs.piece_view).
const FAMILY_COLORS = [ // one per General MIDI family of 8 programs
  "#3d6fd8", "#3dacd8", "#7a5cd6", "#2e9e6b", "#d8673d", "#c9a200", "#b07a2a", "#d63d3d", // piano .. brass
  "#9b4dd6", "#2fb5a0", "#d63d8a", "#6f7fd8", "#6b8e23", "#a0522d", "#708090", "#8a94a6", // reed .. effects
];
const DRUM_COLOR = "#1d2330";
const SEAM_BARS = 4; // the prompt's bars shown before the seam when the roll opens
const LABEL_TOP = 14; // room for the bar numbers above the lanes of the large roll

// the colour of each track: its family's, lighter for a second track of the same family
function trackColors(tracks) {
  const seen = {};
  return tracks.map(([program, drum]) => {
    const family = drum ? "drums" : Math.floor(program / 8);
    const nth = (seen[family] = (seen[family] ?? -1) + 1);
    const base = drum ? DRUM_COLOR : FAMILY_COLORS[family];
    return nth ? mix(base, "#ffffff", Math.min(0.6, 0.28 * nth)) : base;
  });
}

function mix(a, b, share) {
  const rgb = (c) => [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16));
  const [x, y] = [rgb(a), rgb(b)];
  return "#" + x.map((v, i) => Math.round(v + (y[i] - v) * share).toString(16).padStart(2, "0")).join("");
}

// ---- bars ----
// the tick each bar starts at, from the first up to `end`: each meter starts a bar, its bars follow at its length
function barStarts(meters, ticksPerBeat, end) {
  const changes = meters && meters.length ? meters : [[0, 4, 4]];
  const starts = [];
  changes.forEach(([tick, numerator, denominator], k) => {
    const until = k + 1 < changes.length ? changes[k + 1][0] : end + 1;
    const length = Math.max(1, (numerator * 4 * ticksPerBeat) / denominator);
    for (let t = tick; t < until && t <= end; t += length) starts.push(Math.round(t));
  });
  return starts;
}

// the meters of sample `index` (by default the selected one, studio.js's state), else the prompt's
const metersOf = (view, index = state.selected) => view.samples[index]?.meters || view.meters;
const viewEnd = (view) => Math.max(view.total || 0, ...[view.promptNotes, ...view.samples.map((s) => s.notes)].flat().map((n) => n[1]));

// the tick bar `n` (counted from 1) starts at, and the bar that holds `tick`
function barStart(view, n) {
  const end = viewEnd(view) + 64 * 4 * view.ticksPerBeat; // a bar asked for past the end goes on in the last meter
  const starts = barStarts(metersOf(view), view.ticksPerBeat, end);
  return starts[Math.min(Math.max(1, n), starts.length) - 1];
}
function barAt(view, tick) {
  return barStarts(metersOf(view), view.ticksPerBeat, Math.max(0, tick)).length;
}

// ---- the window: which ticks the large roll shows ----
const frame = { view: null, from: 0, to: 0, moved: false }; // moved: by the user, else the default follows the view

function defaultFrame(view) {
  const end = viewEnd(view), seam = view.promptEnd || 0;
  const from = seam && barAt(view, seam - 1) > SEAM_BARS ? barStart(view, barAt(view, seam - 1) - SEAM_BARS + 1) : 0;
  return [from, Math.max(end, from + view.ticksPerBeat)];
}

function currentFrame(view) {
  if (frame.view !== view) Object.assign(frame, { view, moved: false });
  if (!frame.moved) [frame.from, frame.to] = defaultFrame(view);
  return [frame.from, frame.to];
}

// zoom by `factor` (below 1: in) about the tick at `at` (0..1 across the roll), or scroll by `shift` widths
function moveFrame(view, { factor = 1, at = 0.5, shift = 0 }) {
  const [from, to] = currentFrame(view), end = viewEnd(view);
  const span = Math.min(end, Math.max(view.ticksPerBeat, (to - from) * factor));
  let start = from + (to - from) * at - span * at + shift * (to - from);
  start = Math.max(0, Math.min(start, end - span));
  Object.assign(frame, { from: start, to: start + span, moved: true });
}

function resetFrame() { frame.moved = false; }

// the share (0..1) across the large roll where `tick` is, or null outside the window; and back
function rollShare(tick) { return tick < frame.from || tick > frame.to ? null : (tick - frame.from) / (frame.to - frame.from); }
function rollTick(share) { return frame.from + share * (frame.to - frame.from); }

// ---- drawing ----
// The piece drawn: sample `index`'s notes (the prompt's part faded), or the prompt alone while no
// sample has notes; then `chosen`, the prompt's bars [from, to] a run would continue (null: all),
// is shaded and the rest dimmed. What was drawn is kept on the canvas's dataset (read by the
// browser tests).
function drawRoll(canvas, view, index, large, chosen = null) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height;
  ctx.clearRect(0, 0, w, h);
  if (!view) return;
  const sample = view.samples[index];
  const [notes, tracks] = sample && sample.notes.length ? [sample.notes, sample.tracks || view.tracks || []] : [view.promptNotes, view.tracks || []];
  const [from, to] = large ? currentFrame(view) : [0, viewEnd(view)];
  const x = (t) => ((t - from) / (to - from)) * w;
  const colors = trackColors(tracks);
  const lanes = layLanes(notes, tracks, colors, large ? LABEL_TOP : 0, h);
  // the chosen bars, as ticks and as the canvas's x: drawn only over the prompt shown alone
  const [first, last] = (!(sample && sample.notes.length) && chosen) || [];
  const span = first ? [barStart(view, first), barStart(view, last + 1)] : null;
  const across = span && span.map((t) => Math.round(Math.min(w, Math.max(0, x(t)))));
  if (span) { // tinted behind everything, the bar numbers' ruler most
    ctx.fillStyle = "#3d6fd814"; ctx.fillRect(across[0], 0, across[1] - across[0], h);
    if (large) { ctx.fillStyle = "#3d6fd840"; ctx.fillRect(across[0], 0, across[1] - across[0], LABEL_TOP); }
  }

  // bar lines, and above them on the large roll every k-th bar's number, as many as fit apart
  const starts = barStarts(metersOf(view, index), view.ticksPerBeat, to);
  ctx.font = "11px system-ui";
  const wide = ctx.measureText(String(starts.length)).width + 8;
  const narrowest = Math.min(...starts.slice(1).map((t, i) => x(t) - x(starts[i])), w);
  let every = 1;
  while (every < starts.length && every * narrowest < wide) every *= 2;
  const labels = [], lines = [];
  ctx.strokeStyle = "#d5dae3"; ctx.fillStyle = "#8a94a6";
  starts.forEach((t, k) => {
    if (t < from || t > to) return;
    lines.push(t);
    ctx.beginPath(); ctx.moveTo(Math.round(x(t)) + 0.5, large ? LABEL_TOP : 0); ctx.lineTo(Math.round(x(t)) + 0.5, h); ctx.stroke();
    if (large && k % every === 0 && t < to) {
      ctx.fillText(String(k + 1), x(t) + 3, 11);
      labels.push([k + 1, Math.round(x(t) + 3), Math.ceil(ctx.measureText(String(k + 1)).width)]);
    }
  });

  const promptEnd = view.promptEnd ?? 0, continued = sample && sample.notes.length && promptEnd > 0;
  for (const lane of lanes) {
    ctx.fillStyle = "#f0f2f6";
    if (!lane.drum) for (let p = lane.low; p <= lane.high; p++) if ([1, 3, 6, 8, 10].includes(p % 12)) ctx.fillRect(0, lane.y(p), w, lane.row);
    ctx.strokeStyle = "#b8c2d6"; ctx.beginPath(); ctx.moveTo(0, lane.top + 0.5); ctx.lineTo(w, lane.top + 0.5); ctx.stroke();
  }
  const hit = Math.max(2, Math.min(6, (x(view.ticksPerBeat) - x(0)) / 4)); // a drum hit: a short stroke at its onset
  for (const n of notes) {
    const lane = lanes.byTrack[n[3]];
    if (!lane || n[1] < from || n[0] > to) continue;
    ctx.globalAlpha = continued && n[0] < promptEnd ? 0.4 : 1;
    ctx.fillStyle = lane.color;
    const width = lane.drum ? hit : Math.max(2, x(n[1]) - x(n[0]) - 1);
    ctx.fillRect(x(n[0]), lane.y(n[2]), width, Math.max(1, lane.row - 1));
  }
  ctx.globalAlpha = 1;
  if (span) { // the bars left out, dimmed; the chosen ones' edges, drawn
    ctx.fillStyle = "#f4f5f7c0";
    ctx.fillRect(0, 0, across[0], h); ctx.fillRect(across[1], 0, w - across[1], h);
    ctx.strokeStyle = "#3d6fd8"; ctx.lineWidth = 2;
    for (const at of across) { ctx.beginPath(); ctx.moveTo(at, 0); ctx.lineTo(at, h); ctx.stroke(); }
    ctx.lineWidth = 1;
  }
  if (large) lanes.forEach((lane) => { // each lane's instrument at its top left
    ctx.font = "11px system-ui"; ctx.fillStyle = "#ffffffcc";
    const name = lane.name, width = ctx.measureText(name).width;
    ctx.fillRect(2, lane.top + 2, width + 6, 13);
    ctx.fillStyle = lane.color; ctx.fillText(name, 5, lane.top + 12);
  });
  if (promptEnd > 0 && (view.promptNotes.length || continued) && promptEnd >= from && promptEnd <= to) {
    ctx.strokeStyle = "#1d2330"; ctx.setLineDash([4, 3]);
    ctx.beginPath(); ctx.moveTo(Math.round(x(promptEnd)) + 0.5, 0); ctx.lineTo(Math.round(x(promptEnd)) + 0.5, h); ctx.stroke();
    ctx.setLineDash([]);
  }
  Object.assign(canvas.dataset, {
    from, to, sample: sample && sample.notes.length ? index : "",
    chosen: span ? JSON.stringify({ bars: [first, last], ticks: span, x: across }) : "",
    barLines: JSON.stringify(lines), barLabels: JSON.stringify(labels),
    lanes: JSON.stringify(lanes.map(({ track, name, program, drum, color, top, bottom, notes: count, pitches }) =>
      ({ track, name, program, drum, color, top, bottom, notes: count, pitches }))),
  });
}

// a lane per track that has notes, pitched ones in track order and the drums last, each as tall
// as its range of pitches (a drum lane: a row per drum sound used) among `top`..`bottom`
function layLanes(notes, tracks, colors, top, bottom) {
  const used = [...new Set(notes.map((n) => n[3]))].map((track) => {
    const own = notes.filter((n) => n[3] === track), pitches = [...new Set(own.map((n) => n[2]))].sort((a, b) => a - b);
    const [program, drum, name] = tracks[track] || [0, own[0][4], `Track ${track + 1}`];
    return { track, program, drum: Boolean(drum || own[0][4]), name, color: colors[track] || FAMILY_COLORS[0], pitches, notes: own.length };
  }).sort((a, b) => a.drum - b.drum || a.track - b.track);
  const count = {}, nth = {}; // tracks of one instrument are told apart by number: "String Ensemble 1 (2)"
  for (const lane of used) count[lane.name] = (count[lane.name] || 0) + 1;
  for (const lane of used) if (count[lane.name] > 1) lane.name += ` (${(nth[lane.name] = (nth[lane.name] || 0) + 1)})`;
  for (const lane of used) {
    lane.low = lane.drum ? 0 : Math.min(lane.pitches[0] - 2, lane.pitches[lane.pitches.length - 1] - 11);
    lane.high = lane.drum ? lane.pitches.length - 1 : lane.pitches[lane.pitches.length - 1] + 2;
    // the share of the height: by the range of pitches, within bounds so that every lane stays readable
    lane.weight = lane.drum ? Math.max(10, 2 * lane.pitches.length) : Math.min(40, lane.high - lane.low + 1);
  }
  const total = used.reduce((a, l) => a + l.weight, 0);
  let at = top;
  for (const lane of used) {
    const height = ((bottom - top) * lane.weight) / total, rows = lane.high - lane.low + 1;
    Object.assign(lane, { top: Math.round(at), bottom: Math.round(at + height), row: height / rows });
    lane.y = lane.drum
      ? (p) => lane.top + lane.pitches.indexOf(p) * lane.row
      : (p) => lane.top + (lane.high - p) * lane.row;
    at += height;
  }
  used.byTrack = Object.fromEntries(used.map((l) => [l.track, l]));
  return used;
}

// the legend: which sample the large roll shows, and each lane's instrument in its colour
function drawLegend(box, canvas, view, index) {
  const lanes = JSON.parse(canvas.dataset.lanes || "[]");
  box.innerHTML = "";
  if (!view || !lanes.length) return;
  const count = view.samples.length;
  if (view.label) box.append(`${view.label}:`); // the live piece
  else if (canvas.dataset.sample !== "") box.append(count > 1 ? `Sample ${index + 1} of ${count}:` : "Sample:");
  else box.append("Prompt:");
  for (const lane of lanes) {
    const item = document.createElement("span");
    item.className = "instrument";
    item.innerHTML = `<i style="background:${lane.color}"></i>`;
    item.append(lane.name);
    box.append(item);
  }
}

// the large roll's wheel and zoom buttons: Ctrl + wheel zooms about the pointer, the wheel across
// (or Shift + wheel) scrolls; `redraw` draws again
function controlRoll(canvas, buttons, redraw) {
  const view = () => state.view;
  canvas.addEventListener("wheel", (event) => {
    if (!view()) return;
    const box = canvas.getBoundingClientRect(), at = (event.clientX - box.left) / box.width;
    const across = event.shiftKey ? event.deltaY : event.deltaX;
    if (event.ctrlKey || event.metaKey) moveFrame(view(), { factor: Math.exp(event.deltaY / 300), at });
    else if (across) moveFrame(view(), { shift: across / 1000 });
    else return; // the page scrolls
    event.preventDefault();
    redraw();
  }, { passive: false });
  const act = { in: { factor: 0.5 }, out: { factor: 2 }, left: { shift: -0.5 }, right: { shift: 0.5 } };
  for (const [name, how] of Object.entries(act)) buttons[name].onclick = () => { if (view()) { moveFrame(view(), how); redraw(); } };
  buttons.seam.onclick = () => { resetFrame(); redraw(); };
}

// Dragging across the large roll (its lanes or its bar numbers) picks whole bars while `canPick()`:
// `pick(first, last)` gets the bar where the drag began and the one under the pointer, as the
// roll's bar lines count them (from 1); a double-click, `pick()`: every bar. A press that has not
// moved a few pixels stays a click, and the click that ends a drag is no click (the wheel, a
// separate event, zooms and scrolls as ever, mid-drag too: the bar under the pointer follows).
function pickBars(canvas, canPick, pick) {
  const barUnder = (event) => {
    const box = canvas.getBoundingClientRect();
    return barAt(state.view, rollTick(Math.min(1, Math.max(0, (event.clientX - box.left) / box.width))));
  };
  let begun = null, dragged = false;
  canvas.addEventListener("pointerdown", (event) => {
    dragged = false;
    if (event.button !== 0 || !canPick()) return;
    begun = { x: event.clientX, bar: barUnder(event) };
    canvas.setPointerCapture(event.pointerId); // the drag goes on past the roll's edge
  });
  canvas.addEventListener("pointermove", (event) => {
    if (!begun || (!dragged && Math.abs(event.clientX - begun.x) < 4)) return;
    dragged = true;
    pick(begun.bar, barUnder(event));
  });
  for (const end of ["pointerup", "pointercancel"]) canvas.addEventListener(end, () => { begun = null; });
  canvas.addEventListener("click", (event) => { if (dragged) event.stopImmediatePropagation(); }, true);
  canvas.addEventListener("dblclick", () => { if (canPick()) pick(); });
}

// musegen studio: the piano roll, drawn on a canvas from the notes the page holds (studio.js).
"use strict";

const COLORS = ["#3d6fd8", "#d8673d", "#2e9e6b", "#9b4dd6", "#c9a200", "#d63d8a", "#3dacd8", "#7a8a2e"];

// A note is [start, end, pitch, track, drum]. Pitched notes are drawn by pitch; a drum track's
// notes in a lane of their own below them, one row per drum sound used, labelled "drums".
// What was drawn is kept on the canvas's dataset (read by the browser tests).
function draw(canvas, view, only) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height;
  ctx.clearRect(0, 0, w, h);
  if (!view) return;
  const samples = only === undefined ? view.samples.map((s, i) => [s, i]) : [[view.samples[only], only]];
  const all = view.promptNotes.concat(...samples.map(([s]) => (s ? s.notes : [])));
  const pitches = all.filter((n) => !n[4]).map((n) => n[2]);
  const drums = [...new Set(all.filter((n) => n[4]).map((n) => n[2]))].sort((a, b) => a - b);
  const laneH = drums.length ? Math.min(h * 0.3, Math.max(20, drums.length * 8)) : 0;
  const top = h - laneH; // the pitched notes above, the drum lane from here down
  const low = Math.min(48, ...pitches) - 2, high = Math.max(84, ...pitches) + 2;
  const bar = 4 * view.ticksPerBeat;
  const end = Math.max(view.total, ...all.map((n) => n[1]));
  const x = (t) => (t / end) * w, y = (p) => top - ((p - low + 1) / (high - low + 1)) * top;
  const rowH = Math.max(2, top / (high - low + 1)), drumH = laneH / Math.max(1, drums.length);
  const place = (n) => (n[4] ? [top + drums.indexOf(n[2]) * drumH, drumH] : [y(n[2]), rowH]);
  ctx.fillStyle = "#f0f2f6";
  for (let p = low; p <= high; p++) if ([1, 3, 6, 8, 10].includes(p % 12)) ctx.fillRect(0, y(p), w, rowH);
  if (drums.length) { ctx.fillStyle = "#e6e9f0"; ctx.fillRect(0, top, w, laneH); }
  ctx.strokeStyle = "#d5dae3";
  ctx.fillStyle = "#8a94a6"; ctx.font = "11px system-ui";
  // bar numbers on the large roll, every 1st, 2nd, 4th... bar: as many as fit without touching
  const bars = Math.ceil(end / bar), wide = ctx.measureText(String(bars)).width + 8;
  let every = 1;
  while (every < bars && x(every * bar) < wide) every *= 2;
  const labels = [];
  for (let t = 0, n = 1; t <= end; t += bar, n++) {
    ctx.beginPath(); ctx.moveTo(x(t) + 0.5, 0); ctx.lineTo(x(t) + 0.5, h); ctx.stroke();
    if (h > 200 && t < end && (n - 1) % every === 0) {
      ctx.fillText(String(n), x(t) + 3, 11);
      labels.push([n, Math.round(x(t) + 3), Math.ceil(ctx.measureText(String(n)).width)]);
    }
  }
  canvas.dataset.barLabels = JSON.stringify(labels);
  canvas.dataset.end = end; // the tick at the right edge, where the playhead is placed from
  const box = (n, color) => {
    const [at, size] = place(n);
    ctx.fillStyle = color; ctx.fillRect(x(n[0]), at, Math.max(2, x(n[1]) - x(n[0]) - 1), size - 1);
  };
  const promptEnd = view.promptEnd ?? 0;
  view.promptNotes.forEach((n) => box(n, "#8a94a6"));
  for (const [sample, i] of samples) {
    if (!sample) continue;
    ctx.globalAlpha = only === undefined && i !== state.selected ? 0.35 : 1;
    sample.notes.forEach((n) => { if (n[0] >= promptEnd || !view.promptNotes.length) box(n, COLORS[i % COLORS.length]); });
    ctx.globalAlpha = 1;
  }
  if (drums.length) {
    ctx.fillStyle = "#1d2330"; ctx.font = "11px system-ui";
    ctx.fillText("drums", 4, top + Math.min(laneH - 2, 12));
    ctx.strokeStyle = "#8a94a6"; ctx.beginPath(); ctx.moveTo(0, top - 0.5); ctx.lineTo(w, top - 0.5); ctx.stroke();
  }
  const pitched = all.filter((n) => !n[4]);
  canvas.dataset.pitchedBottom = Math.max(0, ...pitched.map((n) => place(n)[0] + place(n)[1]));
  canvas.dataset.drumLane = drums.length
    ? JSON.stringify({ label: "drums", pitches: drums, top, notes: all.length - pitched.length }) : "";
  if (view.promptNotes.length) {
    ctx.strokeStyle = "#1d2330"; ctx.setLineDash([4, 3]);
    ctx.beginPath(); ctx.moveTo(x(promptEnd) + 0.5, 0); ctx.lineTo(x(promptEnd) + 0.5, h); ctx.stroke();
    ctx.setLineDash([]);
  }
}

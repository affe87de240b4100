// musegen studio: playing along with a model (the server's live session, musegen/studio/live.py).
// Everything is timed on the AudioContext's clock: after a bar of count-in clicks, bar b starts at
// `origin + b * bar length`; a little before each bar line (half a grid cell: a note played after
// that is heard in the next bar anyway) the bar's notes go to the server, which streams back the
// model's notes, each scheduled at its time in the piece. In answer mode Space, or a silent bar
// after a phrase, asks for an answer from the next bar line; playing again over an answer hands
// the piece back from the bar line after. In accompany mode each bar asks for the next one's band.
// `window.musegenLive` lists what is scheduled, for the tests.
"use strict";

const LIVE_TICK = 20; // ms between two looks at the clock
const LIVE_AHEAD = 0.12; // seconds of clicks and model notes handed to the synthesiser ahead of time
const COUNT_IN_LEAD = 0.3; // seconds from Start to the first count-in click
// the computer keyboard as a piano: the letter row from C (A) up, the row above for the black keys
const KEY_STEPS = { a: 0, w: 1, s: 2, e: 3, d: 4, f: 5, t: 6, g: 7, y: 8, h: 9, u: 10, j: 11, k: 12, o: 13, l: 14, p: 15, ";": 16 };
const INSTRUMENTS = [[0, "Piano"], [4, "Electric piano"], [11, "Vibraphone"], [16, "Organ"], [24, "Guitar"],
  [33, "Bass"], [48, "Strings"], [56, "Trumpet"], [65, "Saxophone"], [73, "Flute"], [80, "Lead synth"]];
const PLAYER_CHANNEL = 0;
const LIVE_HELP = $("live-status").textContent; // the keys, as the page says them before a session

const live = (window.musegenLive = {
  on: false, id: null, octave: 0, backing: [], // the id: the server's live session
  scheduled: [], // model notes: {tick, end, pitch, velocity, program, drum, at, endAt, arrived, dropped}
  played: [], // the player's notes: {tick, end, pitch, velocity, time}
  barLines: [], // {bar, tick, at}: each bar line the page has reached, with its context time
  posts: [], // each bar sent: {bar, notes, answer, accompany, hand_back, at: its due time, sent, firstNotes}
});

const liveSynth = () => (sound.player instanceof SynthPlayer ? sound.player.synth : null);

function liveContext() {
  if (sound.player instanceof SynthPlayer) return sound.player.context;
  return (live.ownContext = live.ownContext || new AudioContext()); // no synthesiser: its clock and clicks only
}

// piece ticks <-> context seconds
const atTick = (tick) => live.origin + tick * live.secondsPerTick;
const tickAt = (time) => Math.round((time - live.origin) / live.secondsPerTick);

async function liveStart() {
  showError("");
  stopSound();
  const number = (id) => ($(id).value === "" ? null : Number($(id).value));
  const backing = $("live-backing").checked && state.prompt && state.prompt.prompt ? state.prompt.prompt : null;
  const body = { model: $("model").value, mode: $("live-mode").value, bpm: number("live-bpm"), meter: $("live-meter").value,
                 program: Number($("live-program").value), prompt: backing, answer_bars: number("live-answer-bars"),
                 seed: number("seed"), temperature: number("temperature"), top_p: number("top_p") };
  $("live-start").disabled = true;
  try {
    await sound.loading;
    const started = await json(await fetch(api("/api/live"), { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) }));
    const context = liveContext();
    if (context.state !== "running") await context.resume();
    const [numerator, denominator] = started.meter;
    const secondsPerTick = 60 / started.bpm / started.tpq, barSeconds = started.bar_ticks * secondsPerTick;
    const countIn = context.currentTime + COUNT_IN_LEAD;
    Object.assign(live, {
      on: true, id: started.live, context, mode: body.mode, program: body.program, answerBars: started.answer_bars,
      tpq: started.tpq, barTicks: started.bar_ticks, cell: started.cell, secondsPerTick, beats: numerator, meter: started.meter,
      origin: countIn + barSeconds - started.bar * barSeconds, // piece tick 0; its first bar starts after the count-in
      bar: started.bar, next: started.bar, // the bar being played, and the next the server expects
      nextClick: 0, countIn, clickEvery: barSeconds / numerator, space: false, phrase: false,
      scheduled: [], played: [], barLines: [], posts: [], held: new Map(), channels: new Map(),
      backing: started.backing.map(([tick, end, pitch, velocity, program, drum]) => ({ tick, end, pitch, velocity, program, drum: Boolean(drum) })),
    });
    live.barLines.push({ bar: live.bar, tick: live.bar * live.barTicks, at: atTick(live.bar * live.barTicks) });
    const synth = liveSynth();
    if (synth) synth.programChange(PLAYER_CHANNEL, live.program);
    liveView();
    live.timer = setInterval(liveTick, LIVE_TICK);
    document.activeElement.blur(); // Space asks for an answer, and presses no button
    $("cards").innerHTML = "";
    if (!live.midi) live.midi = connectMidi();
    if (live.mode === "accompany") { // the band's first bar, under the player's first
      const first = { bar: null, notes: [], answer: 0, accompany: true, hand_back: false, dropFrom: Infinity, at: countIn };
      live.posts.push(first);
      streamBar(first);
    }
    $("live-stop").disabled = false; $("live-saved").hidden = true;
    $("live-status").textContent = `count-in… then play (bar ${live.bar + 1} of the piece; ${numerator}/${denominator})`;
  } catch (err) {
    showError(err.message);
    $("live-start").disabled = false;
  }
}

async function liveStop() {
  if (!live.on) return;
  live.on = false;
  clearInterval(live.timer);
  for (const [pitch] of live.held) liveRelease(pitch);
  const synth = liveSynth();
  if (synth) for (let channel = 0; channel < 16; channel++) synth.controllerChange(channel, 120, 0); // all sound off
  $("live-stop").disabled = true; showLiveMeters();
  try {
    const saved = await json(await fetch(api(`/api/live/${live.id}/stop`), { method: "POST" }));
    if (saved.midi) {
      $("live-saved").innerHTML = `The piece as played: <a href="${api(`/files/${saved.run}/${saved.midi}`)}" download>MIDI</a>`;
      $("live-saved").hidden = false;
    }
    $("live-status").textContent = "stopped";
  } catch (err) { showError(err.message); }
}

// every LIVE_TICK: the clicks and model notes due soon go to the synthesiser; a bar whose end is near is sent
function liveTick() {
  const now = live.context.currentTime, horizon = now + LIVE_AHEAD;
  for (let at; (at = live.countIn + live.nextClick * live.clickEvery) < horizon; live.nextClick++) {
    click(at, live.nextClick % live.beats === 0);
  }
  handOverNotes(horizon);
  const due = atTick((live.bar + 1) * live.barTicks - live.cell / 2);
  if (now >= due) {
    sendBar(live.bar, due);
    live.bar += 1;
    const tick = live.bar * live.barTicks;
    live.barLines.push({ bar: live.bar, tick, at: atTick(tick) });
    liveView();
  }
}

function click(at, accent) {
  const osc = live.context.createOscillator(), gain = live.context.createGain();
  osc.frequency.value = accent ? 1500 : 1000;
  gain.gain.setValueAtTime(0.25, at);
  gain.gain.exponentialRampToValueAtTime(0.001, at + 0.05);
  osc.connect(gain).connect(live.context.destination);
  osc.start(at); osc.stop(at + 0.06);
}

// Bar `bar` is over up to context time `due`: its notes are sent. Within an answer, only when the
// player came in (the answer is dropped from the next bar line); otherwise with the request for
// an answer (Space, or a silent bar after a phrase) or for the next bar's accompaniment.
function sendBar(bar, due) {
  const notes = live.played.filter((n) => !n.sent && n.time < due);
  for (const n of notes) { n.sent = true; if (n.end === null) n.sentEnd = Math.max(n.tick + 1, tickAt(due)); }
  const rows = notes.map((n) => [n.tick, n.end ?? n.sentEnd, n.pitch, n.velocity]);
  const inAnswer = bar < live.next;
  if (inAnswer && !rows.length) return;
  const asked = live.mode === "answer" && (live.space || (!rows.length && live.phrase));
  const post = { bar, notes: rows, answer: asked ? live.answerBars : 0, accompany: live.mode === "accompany", hand_back: inAnswer };
  if (inAnswer) dropAnswer((bar + 1) * live.barTicks);
  post.dropFrom = Infinity; // the tick from which a hand back drops this post's notes
  live.next = bar + 1 + post.answer;
  live.space = false;
  live.phrase = asked ? false : live.phrase || rows.length > 0;
  live.posts.push(Object.assign(post, { at: due }));
  $("live-status").textContent = post.answer ? `bar ${bar + 1}: asking for ${post.answer} bars…` : inAnswer ? "your turn again" : `bar ${bar + 1}`;
  streamBar(post);
}

async function streamBar(post) {
  post.sent = live.context.currentTime;
  try {
    const { bar, notes, answer, accompany, hand_back } = post;
    const response = await fetch(api(`/api/live/${live.id}/bar`), {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ bar, notes, answer, accompany, hand_back }),
    });
    if (!response.ok) await json(response);
    await readEvents(response, (event) => {
      if (event.event === "notes") schedule(event.notes, post);
      if (event.event === "notes" && post.firstNotes === undefined) post.firstNotes = live.context.currentTime;
      else if (event.event === "error") throw new Error(event.error);
      else if (event.event === "done" && post.answer) $("live-status").textContent = `answered ${post.answer} bars`;
    });
  } catch (err) { if (live.on) showError(err.message); }
}

// the model's notes [start, end, pitch, velocity, program, drum] asked for by `post`, each at its time in the piece
function schedule(rows, post) {
  const arrived = live.context.currentTime, cut = post.dropFrom;
  for (const [tick, end, pitch, velocity, program, drum] of rows) {
    live.scheduled.push({ tick, end, pitch, velocity, program, drum: Boolean(drum), at: atTick(tick), endAt: atTick(end),
                          arrived, dropped: tick >= cut });
  }
  liveView();
}

// the player came back in: the model's notes from tick `cut` on are not played, nor those still to come
function dropAnswer(cut) {
  for (const n of live.scheduled) if (n.tick >= cut && !n.handed) n.dropped = true;
  for (const post of live.posts) post.dropFrom = Math.min(post.dropFrom, cut);
}

function channelOf(program, drum) {
  if (drum) return 9;
  if (!live.channels.has(program)) {
    const free = [...Array(16).keys()].filter((c) => c !== 9 && c !== PLAYER_CHANNEL && ![...live.channels.values()].includes(c));
    live.channels.set(program, free[0] ?? 1);
    const synth = liveSynth();
    if (synth) synth.programChange(live.channels.get(program), program);
  }
  return live.channels.get(program);
}

// the model's notes due before `horizon`, to the synthesiser (a note that came late sounds at once)
function handOverNotes(horizon) {
  const synth = liveSynth();
  for (const n of live.scheduled) {
    if (n.handed || n.dropped || n.at >= horizon) continue;
    n.handed = true;
    if (!synth) continue;
    const channel = channelOf(n.program, n.drum), now = live.context.currentTime;
    synth.noteOn(channel, n.pitch, n.velocity, { time: Math.max(n.at, now) });
    synth.noteOff(channel, n.pitch, { time: Math.max(n.endAt, now + 0.05) });
  }
}

// ---- the player's notes ----
function livePress(pitch, velocity = 96) {
  if (!live.on || live.held.has(pitch) || pitch < 0 || pitch > 127) return;
  const time = live.context.currentTime;
  const note = { tick: tickAt(time), end: null, pitch, velocity, time };
  live.held.set(pitch, note);
  live.played.push(note);
  // over an answer: it stops at the next bar line, before any of its notes there reaches the synthesiser
  const bar = Math.floor((note.tick + live.cell / 2) / live.barTicks); // the bar the model hears it in
  if (bar < live.next && bar > live.bar - 1) dropAnswer((bar + 1) * live.barTicks);
  const synth = liveSynth();
  if (synth) synth.noteOn(PLAYER_CHANNEL, pitch, velocity);
  showKey(pitch, true);
  liveView();
}

function liveRelease(pitch) {
  const note = live.held.get(pitch);
  if (!note) return;
  live.held.delete(pitch);
  note.end = Math.max(note.tick + 1, tickAt(live.context.currentTime));
  const synth = liveSynth();
  if (synth) synth.noteOff(PLAYER_CHANNEL, pitch);
  showKey(pitch, false);
  liveView();
}

const typing = (event) => ["INPUT", "SELECT", "TEXTAREA"].includes(event.target.tagName) && event.target.type !== "checkbox";

function onKey(event, down) {
  if (!live.on || typing(event) || event.ctrlKey || event.metaKey || event.altKey) return;
  const key = event.key.toLowerCase();
  if (key === " ") {
    event.preventDefault();
    if (down && live.mode === "answer") { live.space = true; $("live-status").textContent = "the model answers from the next bar line"; }
    return;
  }
  if (down && (key === "z" || key === "x")) { live.octave = Math.max(-3, Math.min(3, live.octave + (key === "z" ? -1 : 1))); return; }
  if (!(key in KEY_STEPS)) return;
  event.preventDefault();
  const pitch = 60 + 12 * live.octave + KEY_STEPS[key];
  if (down && !event.repeat) livePress(pitch); else if (!down) liveRelease(pitch);
}

// ---- on-screen keys and a MIDI keyboard ----
function buildKeys() {
  const box = $("live-keys"), letters = Object.keys(KEY_STEPS), whites = letters.filter((k) => ![1, 3, 6, 8, 10].includes(KEY_STEPS[k] % 12));
  letters.forEach((letter) => {
    const step = KEY_STEPS[letter], black = [1, 3, 6, 8, 10].includes(step % 12);
    const key = document.createElement("button");
    key.type = "button"; key.textContent = letter.toUpperCase(); key.dataset.step = step;
    if (black) {
      key.className = "black";
      const left = whites.findIndex((w) => KEY_STEPS[w] > step); // the white key after it
      key.style.left = `calc(${(100 * left) / whites.length}% - 3.5%)`;
    }
    const pitch = () => 60 + 12 * live.octave + step;
    key.addEventListener("pointerdown", (e) => { e.preventDefault(); key.setPointerCapture(e.pointerId); key.dataset.pitch = pitch(); livePress(pitch()); });
    key.addEventListener("pointerup", () => liveRelease(Number(key.dataset.pitch)));
    box.appendChild(key);
  });
}

function showKey(pitch, down) {
  const step = pitch - 60 - 12 * live.octave;
  const key = $("live-keys").querySelector(`[data-step="${step}"]`);
  if (key) key.classList.toggle("down", down);
}

async function connectMidi() {
  if (!navigator.requestMIDIAccess) return; // this browser has no Web MIDI: the keyboard and keys play
  try {
    const access = await navigator.requestMIDIAccess();
    const listen = (input) => { input.onmidimessage = ({ data: [status, pitch, velocity] }) => {
      const kind = status & 0xf0;
      if (kind === 0x90 && velocity > 0) livePress(pitch, velocity);
      else if (kind === 0x80 || kind === 0x90) liveRelease(pitch);
    }; };
    access.inputs.forEach(listen);
    access.onstatechange = (e) => e.port.type === "input" && e.port.state === "connected" && listen(e.port);
  } catch { /* refused by the user: the keyboard and keys still play */ }
}

// ---- the Meter menu ----
// the meters the chosen model plays live (the server tried each), the choice kept where it is still
// offered, else 4/4 or the first; a model that cannot play along offers none, and no Start, and says so
function showLiveMeters() {
  const m = state.models.find((x) => x.name === $("model").value);
  const meters = m ? m.live_meters : [], menu = $("live-meter"), chosen = menu.value;
  menu.length = 0;
  for (const meter of meters) menu.add(new Option(meter, meter));
  menu.value = meters.includes(chosen) ? chosen : meters.includes("4/4") ? "4/4" : meters[0] ?? "";
  menu.disabled = !meters.length;
  $("live-start").disabled = live.on || !meters.length;
  if (!live.on) $("live-status").textContent = meters.length ? LIVE_HELP : "The chosen model cannot play along: choose another.";
}

// ---- the roll: the live piece as it grows, the player's notes in track 0 ----
function liveView() {
  // the model's instruments by name (the backing's are the band's before you start), one lane each
  const named = (program) => INSTRUMENTS.find(([p]) => p === program)?.[1] || `program ${program}`;
  const tracks = [[live.program, 0, `You (${named(live.program)})`]];
  const trackOf = new Map();
  const notes = live.played.map((n) => [n.tick, n.end ?? tickAt(live.context.currentTime), n.pitch, 0, 0, n.velocity]);
  for (const n of [...live.backing, ...live.scheduled]) {
    if (n.dropped) continue;
    const key = `${n.program}/${n.drum}`;
    if (!trackOf.has(key)) { trackOf.set(key, tracks.length); tracks.push([n.program, Number(n.drum), `musegen (${n.drum ? "Drums" : named(n.program)})`]); }
    notes.push([n.tick, n.end, n.pitch, trackOf.get(key), Number(n.drum), n.velocity]);
  }
  notes.sort((a, b) => a[0] - b[0] || a[2] - b[2]);
  const meters = [[0, ...live.meter]];
  const total = Math.max(live.barTicks, (live.bar + 2) * live.barTicks);
  state.view = { label: "Live", ticksPerBeat: live.tpq, promptNotes: [], promptEnd: 0, total, tracks, meters,
                 samples: [{ notes, tracks, meters }] };
  state.selected = 0;
  redraw();
}

// ---- start ----
for (const [program, name] of INSTRUMENTS) $("live-program").add(new Option(name, program));
$("live-start").onclick = liveStart;
$("live-stop").onclick = liveStop;
document.addEventListener("keydown", (e) => onKey(e, true));
document.addEventListener("keyup", (e) => onKey(e, false));
buildKeys();

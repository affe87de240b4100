// musegen studio: the page. No framework and no build: it talks to its own server only.
"use strict";

const $ = (id) => document.getElementById(id);
const session = localStorage.getItem("musegen-session") || crypto.randomUUID().replaceAll("-", "");
localStorage.setItem("musegen-session", session);
const api = (path) => path + (path.includes("?") ? "&" : "?") + "session=" + session;

const state = {
  models: [], prompt: null, view: null, // view: {ticksPerBeat, promptNotes, promptEnd, total, samples: [...]}
  selected: 0, controller: null, run: null, maxBars: 64,
};

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

async function json(response) {
  const body = await response.json().catch(() => ({ error: `the server answered ${response.status}` }));
  if (!response.ok) throw new Error(body.error || `the server answered ${response.status}`);
  return body;
}

function setStatus(text) { $("status").textContent = text; }

function redraw() {
  drawRoll($("roll"), state.view, state.selected, true, chosenBars());
  drawLegend($("legend"), $("roll"), state.view, state.selected);
  document.querySelectorAll(".sample").forEach((card) => {
    const i = Number(card.dataset.index);
    card.classList.toggle("selected", i === state.selected);
    drawRoll(card.querySelector("canvas"), state.view, i, false);
  });
}

// ---- samples ----
function kept() { return JSON.parse(localStorage.getItem("musegen-kept") || "[]"); }
function toggleKeep(key) {
  const list = kept(), at = list.indexOf(key);
  at < 0 ? list.push(key) : list.splice(at, 1);
  localStorage.setItem("musegen-kept", JSON.stringify(list));
}

// `withFiles`: each sample is written (its view names its run): its Keep, downloads and Extend
function sampleCards(count, withFiles) {
  const box = $("cards");
  box.innerHTML = "";
  for (let i = 0; i < count; i++) {
    const card = document.createElement("div");
    card.className = "sample"; card.dataset.index = i;
    card.innerHTML = `<h3>Sample ${i + 1}</h3><canvas width="680" height="110"></canvas>`;
    card.querySelector("canvas").onclick = () => select(i);
    box.appendChild(card);
  }
  if (withFiles) addDownloads();
  showTransport(withFiles ? count : 0);
  redraw();
}

function addDownloads() {
  document.querySelectorAll(".sample").forEach((card) => {
    const i = Number(card.dataset.index), sample = state.view.samples[i];
    if (!sample || !sample.files) return;
    const stem = sample.files.midi.replace(/\.mid$/, "");
    const file = (name) => api(`/files/${sample.run}/${name}`);
    const key = `${sample.run}/${sample.index}`;
    card.classList.toggle("kept", kept().includes(key));
    const row = document.createElement("div");
    row.innerHTML = `<div class="row"><button class="keep" type="button">Keep</button></div>
      <div class="row downloads">Download: <a href="${file(sample.files.midi)}" download>MIDI</a>
      <a href="${file(stem + ".wav")}" download>WAV</a>
      <a href="${file(sample.files.json || stem + ".json")}" download>MIREX JSON</a></div>
      <div class="row extending"><button class="extend" type="button">Extend</button>
      by <input class="extend-bars" type="number" min="1" max="${state.maxBars}" step="1" value="4"> bars</div>`;
    row.querySelector(".keep").onclick = () => { toggleKeep(key); card.classList.toggle("kept", kept().includes(key)); loadResults(); };
    row.querySelector(".extend").onclick = () => extend(i, row.querySelector(".extend-bars").value);
    card.appendChild(row);
  });
}

function viewOf(samples, ticksPerBeat) {
  const first = samples[0] || {};
  const promptEnd = first.prompt_end ?? null;
  const promptNotes = promptEnd === null ? [] : first.notes.filter((n) => n[0] < promptEnd);
  const total = Math.max(...samples.map((s) => Math.max(0, ...s.notes.map((n) => n[1]))));
  return { ticksPerBeat, promptNotes, promptEnd, total, tracks: first.tracks, meters: first.meters,
           samples: samples.map((s) => ({ ...s, notes: s.notes })) };
}

// ---- sound ----
// Play: the selected sample from the "from bar" (by default two bars before the seam, where the
// prompt ends), on the page's synthesiser (player.js) once its soundfont is loaded, which starts
// when the page opens; without it, on the server's WAV, and the note beside the buttons says why.
// A sample button or card switches sample where the playhead is; the loop's box, on or off, takes
// effect there too.
const sound = { player: null, loading: null, playing: false, started: null }; // started: the last Play, timed

function loadSound(missing) {
  const wav = (why) => {
    sound.player = new WavPlayer($("wav"), () => {
      showError(`sample ${state.selected + 1}: the audio could not be rendered (is FluidSynth installed?)`);
      stopSound();
    });
    $("sound-note").textContent = `Playing the server's WAV: ${why}.`;
    $("transport").dataset.engine = "wav";
  };
  if (missing) return wav(missing);
  $("sound-note").textContent = "loading the soundfont…";
  sound.loading = SynthPlayer.load().then(
    (player) => { sound.player = player; $("sound-note").textContent = ""; $("transport").dataset.engine = "synth"; },
    (err) => wav(`the in-page synthesiser could not start (${err.message})`),
  );
}

function showTransport(samples) {
  stopSound();
  $("play").disabled = !samples;
  $("ab").innerHTML = samples > 1 ? "Sample:" : "";
  for (let i = 0; samples > 1 && i < samples; i++) {
    const button = document.createElement("button");
    button.textContent = String(i + 1); button.onclick = () => select(i);
    button.classList.toggle("selected", i === state.selected);
    $("ab").appendChild(button);
  }
  $("from-bar").value = state.view ? Math.max(1, barAt(state.view, state.view.promptEnd || 0) - 2) : 1;
}

function select(i) {
  state.selected = i;
  redraw();
  [...$("ab").children].forEach((b, k) => b.classList.toggle("selected", k === i));
  if (sound.playing) playSound(sound.player.position()); // the other sample, from where this one is
}

// plays the selected sample from the "from bar", or from tick `begin` when given
async function playSound(begin) {
  const clicked = performance.now();
  const view = state.view, sample = view && view.samples[state.selected];
  if (!sample || !sample.tracks) return;
  await sound.loading;
  const from = barStart(view, Number($("from-bar").value));
  const loopEnd = $("loop").checked ? barStart(view, barAt(view, Math.max(view.promptEnd || 0, from)) + 2) : null;
  const wav = api(`/files/${sample.run}/${sample.files.midi.replace(/\.mid$/, ".wav")}`);
  const time = timeline(sample.tempos, view.ticksPerBeat);
  const first = await sound.player.start(sample, time, { from, begin: begin ?? from, loopEnd, wav });
  if (!sound.player.play) return; // stopped while it started (a WAV is rendered first)
  if (sound.player instanceof SynthPlayer) {
    sound.started = { clicked, heard: sound.player.heardAt(first), from, sample: state.selected };
    $("transport").dataset.clickToSound = (sound.started.heard - clicked).toFixed(1);
  }
  $("stop-sound").disabled = false; $("playhead").hidden = false;
  $("transport").dataset.playing = "1";
  if (!sound.playing) { sound.playing = true; requestAnimationFrame(followPlayhead); }
}

function stopSound() {
  if (sound.player) sound.player.stop();
  sound.playing = false;
  $("stop-sound").disabled = true; $("playhead").hidden = true;
  $("transport").dataset.playing = "";
}

function followPlayhead() {
  if (!sound.playing) return;
  const tick = sound.player.position();
  if (tick === null) return stopSound(); // played to its end
  const share = rollShare(tick); // null outside the roll's window
  $("playhead").style.visibility = share === null ? "hidden" : "";
  $("playhead").style.left = `${100 * (share ?? 0)}%`;
  requestAnimationFrame(followPlayhead);
}

// a click on the large roll chooses the bar to play from
function chooseBar(event) {
  if (!state.view) return;
  const box = $("roll").getBoundingClientRect();
  $("from-bar").value = barAt(state.view, rollTick((event.clientX - box.left) / box.width));
  if (sound.playing) playSound();
}

// ---- prompt ----
// `label` is the prompt's name; the menu and the file box are emptied after each pick, so that
// picking the same one again loads it again (the prompt line names the prompt held)
async function loadPrompt(query, body, label) {
  showError("");
  $("example").value = ""; $("file").value = "";
  try {
    const model = $("model").value;
    const prompt = await json(await fetch(api(`/api/prompts?model=${encodeURIComponent(model)}&${query}`), { method: "POST", body }));
    state.prompt = prompt;
    showTransport(0);
    $("prompt-name").textContent = `Prompt: ${prompt.name} (${prompt.bars} bars, ${prompt.notes.length} notes)`;
    showPromptBars(1, prompt.bars, prompt.bars, prompt.name.endsWith(".json"));
    state.view = { ticksPerBeat: prompt.ticks_per_beat, promptNotes: prompt.notes, tracks: prompt.tracks,
                   meters: prompt.meters, samples: [] };
    // the seam: the bar line after the prompt's last bar, where the continuation starts
    state.view.promptEnd = barStart(state.view, prompt.bars + 1);
    state.view.total = barStart(state.view, prompt.bars + Number($("bars").value || 0) + 1);
    $("cards").innerHTML = "";
    redraw();
  } catch (err) {
    state.prompt = null;
    showPromptBars();
    $("prompt-name").textContent = `No prompt (${label} is not used): the model starts from scratch.`;
    showError(err.message);
  }
}

function uploadFile(file) {
  if (file) loadPrompt(`name=${encodeURIComponent(file.name)}`, file, file.name);
}

// The prompt's bars the run continues, from..to (1-based, as the roll numbers them): shown for a
// prompt file (`last`: its bars; null where not known), hidden without one; a MIREX task is
// continued from its first bar (its times count from its own origin)
function showPromptBars(from, to, last, fromFirst) {
  $("prompt-bars").hidden = from === undefined;
  $("prompt-from").value = from ?? ""; $("prompt-to").value = to ?? "";
  $("prompt-from").max = $("prompt-to").max = last ?? "";
  $("prompt-from").disabled = Boolean(fromFirst);
}

// the prompt bars as the request sends them, checked in the page: null where they are the
// default (the whole prompt, as `musegen sample` without --prompt-from and --prompt-bars)
function promptBars() {
  const p = state.prompt;
  if (!p || p.extend) return {};
  const last = p.bars ?? Infinity, range = (low) => (last === Infinity ? `${low} or more` : `from ${low} to ${last}`);
  const bar = (id, empty) => { const v = $(id).value.trim(); return v === "" ? empty : /^\d+$/.test(v) ? Number(v) : NaN; };
  const from = bar("prompt-from", 1), to = bar("prompt-to", last);
  if (!(from >= 1 && from <= last)) throw new Error(`prompt from bar must be a whole number ${range(1)}`);
  if (!(to >= from && to <= last)) throw new Error(`prompt to bar must be a whole number ${range(from)}`);
  return { prompt_from: from > 1 ? from : null, prompt_to: to < last ? to : null };
}

// the prompt's bars the boxes choose, [from, to], to shade on the roll: null for the whole prompt,
// for none, or while the boxes hold what Generate would refuse
function chosenBars() {
  try {
    const { prompt_from: from, prompt_to: to } = promptBars();
    return from || to ? [from ?? 1, to ?? state.prompt.bars] : null;
  } catch { return null; }
}

// a drag on the roll writes the bars it spans into the boxes (the one place the choice is held),
// within the prompt; `pick()`: all of them. A MIREX task keeps its first bar (its box is fixed).
function pickPromptBars(first, last) {
  const bars = state.prompt.bars, within = (n) => Math.min(Math.max(1, n), bars);
  const [from, to] = first === undefined ? [1, bars] : [within(Math.min(first, last)), within(Math.max(first, last))];
  if (!$("prompt-from").disabled) $("prompt-from").value = from;
  $("prompt-to").value = to;
  redraw();
}

// the roll picks bars while it shows a prompt file alone, whose bars are known
const canPickBars = () => !state.controller && !$("prompt-bars").hidden && Boolean(state.prompt?.bars) && $("roll").dataset.sample === "";

// the sampling settings of the form, as a run or an extension sends them
function formSettings() {
  const number = (id) => ($(id).value === "" ? null : Number($(id).value));
  return { model: $("model").value, temperature: number("temperature"), top_p: number("top_p"), seed: number("seed"),
           tempo: $("tempo").value.trim() || null, bars: number("bars"), samples: number("samples") };
}

// the form's run: its prompt (an uploaded one, or an earlier sample brought back from the results)
function request() {
  const p = state.prompt, extend = p && p.extend;
  return { ...formSettings(), prompt: p && !extend ? p.prompt : null, ...promptBars(),
           extend_run: extend ? extend.run : null, extend_sample: extend ? extend.sample : null };
}

// `into`: for an extension, the card whose sample is extended (null: the run's own cards)
function onEvent(event, req, into) {
  if (event.event === "queued") { state.run = event.run; setStatus("waiting for a free worker…"); }
  else if (event.event === "started") setStatus("sampling…");
  else if (event.event === "notes" && into !== null) { // the sample grows in its own card
    $("progress").value = event.progress;
    const delta = event.samples[0];
    state.streamed = state.streamed.slice(0, delta.from).concat(delta.notes);
    state.view.samples[into] = { ...state.view.samples[into], notes: state.streamed };
    redraw();
    $("roll").dataset.notes = state.streamed.length; // read by the browser test
  } else if (event.event === "notes") {
    $("progress").value = event.progress;
    const tpb = state.view ? state.view.ticksPerBeat : 480;
    const bars = state.prompt ? state.prompt.bars : 0;
    state.view = state.view || { ticksPerBeat: tpb, promptNotes: [], promptEnd: 0, samples: [] };
    state.view.total = barStart(state.view, bars + req.bars + 1);
    if (!state.view.samples.length || $("cards").children.length !== event.samples.length) {
      state.view.samples = event.samples.map(() => ({ notes: [] }));
      sampleCards(event.samples.length);
    }
    // each sample's event holds only what changed: keep its first `from` notes, then append the rest
    event.samples.forEach((delta, i) => {
      const sample = state.view.samples[i];
      Object.assign(sample, { notes: sample.notes.slice(0, delta.from).concat(delta.notes), tracks: delta.tracks, meters: delta.meters });
    });
    redraw();
    $("roll").dataset.notes = state.view.samples.reduce((a, s) => a + s.notes.length, 0); // read by the browser test
  } else if (event.event === "done") {
    $("progress").value = 1;
    into === null ? showRun(event.run, event.samples) : placeSample(into, event.run, event.samples[0]);
    setStatus(`done: ${event.stats.new_tokens} tokens in ${event.stats.seconds} s`);
    loadResults();
  } else if (event.event === "stopped" && event.run) { // Stop kept the bars drawn so far
    into === null ? showRun(event.run, event.samples) : placeSample(into, event.run, event.samples[0]);
    setStatus(`stopped: ${event.bars} bars kept`);
    loadResults();
  } else if (event.event === "stopped") setStatus("stopped");
  else if (event.event === "error") { showError(event.error); setStatus("failed"); }
}

async function generate() {
  showError("");
  let req;
  try { req = request(); } catch (err) { return showError(err.message); }
  if (state.view) state.view.samples = [];
  $("cards").innerHTML = "";
  showTransport(0);
  await stream(req, null);
}

// Extend: sample i continued by `bars` more bars, in its card. The whole sample is the prompt
// (the server continues its MIDI file as `musegen sample --prompt <it>` does, with the model that
// made it), with the form's temperature, top-p, seed and tempo; the result is a run of its own,
// listed with the others, and takes the sample's place. A run that fails or is let go leaves it.
async function extend(i, bars) {
  if (state.controller) return;
  showError("");
  const n = /^\d+$/.test(String(bars).trim()) ? Number(bars) : NaN, sample = state.view.samples[i];
  if (!(n >= 1 && n <= state.maxBars)) return showError(`extend by a whole number of bars from 1 to ${state.maxBars}`);
  state.selected = i;
  const end = Math.max(0, ...sample.notes.map((note) => note[1]));
  state.view.total = Math.max(state.view.total, barStart(state.view, barAt(state.view, end) + n + 1));
  state.streamed = [];
  const req = { ...formSettings(), bars: n, samples: 1, extend_run: sample.run, extend_sample: sample.index };
  const last = await stream(req, i);
  if (!(last && last.run && (last.event === "done" || last.event === "stopped"))) {
    state.view.samples[i] = sample;
    redraw();
  }
}

// each event of an NDJSON response (one JSON object a line) to `onEvent`, as it arrives
async function readEvents(response, onEvent) {
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n")) >= 0) {
      const event = JSON.parse(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 1);
      onEvent(event);
    }
  }
}

// posts `req` and follows its run's events to their end; returns the last one
async function stream(req, into) {
  let last = null;
  state.controller = new AbortController();
  $("generate").disabled = true; $("stop").disabled = false; $("progress").value = 0;
  state.run = null;
  setStatus("starting…");
  try {
    const response = await fetch(api("/api/generate"), {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(req), signal: state.controller.signal,
    });
    if (!response.ok) await json(response);
    await readEvents(response, (event) => { last = event; onEvent(event, req, into); });
  } catch (err) {
    if (err.name === "AbortError") setStatus("stopped"); else { showError(err.message); setStatus("failed"); }
  } finally {
    $("generate").disabled = false; $("stop").disabled = true; state.controller = null;
  }
  return last;
}

// Stop: the server ends the run and keeps the bars drawn so far (the stream says so); a run not
// yet named by the server, or a server that cannot be asked, is let go (nothing is kept)
async function stop() {
  const controller = state.controller;
  if (!controller) return;
  $("stop").disabled = true;
  setStatus("stopping…");
  const run = state.run;
  const asked = run && (await fetch(api(`/api/runs/${run}/stop`), { method: "POST" }).then((r) => r.ok, () => false));
  if (!asked) controller.abort();
}

function showRun(run, samples) {
  state.run = run; state.selected = 0;
  state.view = viewOf(samples.map((s) => ({ ...s, run })), samples[0] ? samples[0].ticks_per_beat : 480);
  sampleCards(samples.length, true);
}

// an extension's sample, written as run `run`, in the place of the sample it extends
function placeSample(i, run, sample) {
  state.run = run;
  state.view.samples[i] = { ...sample, run };
  state.view.total = Math.max(...state.view.samples.map((s) => Math.max(0, ...s.notes.map((n) => n[1]))));
  sampleCards(state.view.samples.length, true);
}

// ---- earlier results ----
async function loadResults() {
  try {
    const { results } = await json(await fetch(api("/api/results")));
    const keptRuns = new Set(kept().map((k) => k.split("/")[0]));
    $("results").innerHTML = "";
    for (const r of results) {
      const li = document.createElement("li");
      const s = r.settings, from = s.prompt_from ?? 1, cut = from > 1 || s.prompt_bars;
      li.textContent = `${keptRuns.has(r.run) ? "★ " : ""}${clock(r.run)} ` +
        `${r.stem} with ${r.model || "a model no longer offered"}: ${r.samples.length} × ${s.bars} bars, seed ${s.seed}, ` +
        `T=${s.temperature}, p=${s.top_p}, tempo ${s.tempo}` + (r.stopped ? ` (stopped at ${r.stopped_at_bars} bars)` : "") +
        (cut ? `, prompt bars ${from}–${from + r.prompt_bars - 1}` : "") +
        (r.extends ? ` (extends sample ${r.extends.sample + 1} of ${clock(r.extends.run)})` : "");
      li.onclick = async () => {
        try {
          const d = await json(await fetch(api(`/api/runs/${r.run}`)));
          restoreForm(r); showRun(r.run, d.views); showError("");
        } catch (err) { showError(err.message); }
      };
      $("results").appendChild(li);
    }
  } catch (err) { showError(err.message); }
}

function clock(run) { return run.slice(9, 15).replace(/(..)(..)(..)/, "$1:$2:$3"); }

// the form as it was for an earlier run: its model, its prompt (an uploaded one and its bars, or
// the earlier sample an extension continued), its settings (as the run recorded them)
function restoreForm(r) {
  if (state.models.some((m) => m.name === r.model)) { $("model").value = r.model; showModel(); }
  const s = r.settings;
  const fields = { bars: s.bars, samples: s.num_samples, temperature: s.temperature, top_p: s.top_p, seed: s.seed, tempo: s.tempo };
  for (const [id, value] of Object.entries(fields)) $(id).value = value ?? "";
  const from = s.prompt_from ?? 1, cut = from > 1 || s.prompt_bars; // if cut, the file's own bars are not known here
  state.prompt = r.prompt_id ? { prompt: r.prompt_id, name: r.prompt_name, bars: cut ? null : r.prompt_bars }
    : r.extends ? { extend: r.extends, name: r.extends.name, bars: r.prompt_bars } : null;
  $("prompt-name").textContent = !state.prompt ? "No prompt: the model starts from scratch."
    : r.extends ? `Prompt: ${r.prompt_name}, sample ${r.extends.sample + 1} of ${clock(r.extends.run)} (${r.prompt_bars} bars)`
    : `Prompt: ${r.prompt_name} (${cut ? `bars ${from} to ${from + r.prompt_bars - 1}` : `${r.prompt_bars} bars`})`;
  if (r.prompt_id) showPromptBars(from, from + r.prompt_bars - 1, state.prompt.bars, r.prompt_name.endsWith(".json"));
  else showPromptBars();
  $("example").value = ""; $("file").value = "";
}

// ---- start ----
// what the chosen model offers: its defaults, the examples it continues, the meters it plays live (live.js)
function showModel() { showDefaults(); showExamples(); showLiveMeters(); }

function showDefaults() {
  const m = state.models.find((x) => x.name === $("model").value);
  if (!m) return;
  $("temperature").placeholder = `${m.defaults.temperature} (default)`;
  $("top_p").placeholder = `${m.defaults.top_p} (default)`;
}

// the examples the chosen model can continue (the server has tried each with its tokenizer)
function showExamples() {
  const m = state.models.find((x) => x.name === $("model").value);
  $("example").length = 1; // "choose…"
  for (const e of m ? m.examples : []) $("example").add(new Option(e, e));
}

async function start() {
  try {
    const info = await json(await fetch(api("/api/models")));
    state.models = info.models;
    for (const m of info.models) $("model").add(new Option(`${m.name} (${m.tokenizer})`, m.name));
    $("bars").max = state.maxBars = info.max_bars; $("samples").max = info.max_samples;
    // the prompt held is read again by the new model's tokenizer, or let go; an earlier sample
    // is continued by the model that made it, whichever is chosen
    $("model").onchange = () => {
      showModel();
      if (state.prompt && state.prompt.prompt) loadPrompt(`prompt=${state.prompt.prompt}`, null, state.prompt.name);
    };
    showModel();
    loadSound(info.sound_missing);
    setStatus("ready");
  } catch (err) { showError(err.message); }
  $("file").onchange = (e) => uploadFile(e.target.files[0]);
  $("example").onchange = (e) => { if (e.target.value) loadPrompt(`example=${encodeURIComponent(e.target.value)}`, null, e.target.value); };
  const drop = $("drop");
  drop.ondragover = (e) => { e.preventDefault(); drop.classList.add("over"); };
  drop.ondragleave = () => drop.classList.remove("over");
  drop.ondrop = (e) => { e.preventDefault(); drop.classList.remove("over"); uploadFile(e.dataTransfer.files[0]); };
  $("generate").onclick = generate;
  $("stop").onclick = stop;
  $("play").onclick = () => playSound();
  $("stop-sound").onclick = stopSound;
  $("roll").onclick = chooseBar;
  pickBars($("roll"), canPickBars, pickPromptBars);
  $("prompt-from").oninput = $("prompt-to").oninput = redraw;
  $("all-bars").onclick = () => pickPromptBars();
  controlRoll($("roll"), { in: $("zoom-in"), out: $("zoom-out"), left: $("scroll-left"), right: $("scroll-right"), seam: $("seam") }, redraw);
  $("loop").onchange = () => sound.playing && playSound(sound.player.position());
  loadResults();
}

start();

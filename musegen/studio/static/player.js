// musegen studio: playing a result. A General MIDI synthesiser runs in the page (spessasynth_lib,
// an AudioWorklet, served by the studio with the soundfont its WAVs are rendered with); the notes
// the page already holds are handed to it a little ahead of their time, so Stop, another sample or
// the loop's turn take effect at once. Where it cannot run, the server's WAV plays instead.
"use strict";

const LEAD = 0.03; // seconds from Play to the first sound: the notes' way to the synthesiser's thread
const LOOKAHEAD = 0.12; // seconds of notes handed over ahead of time: a Stop or a switch silences those
const HAND_OVER_EVERY = 25; // ms
const DRUM_CHANNEL = 9; // General MIDI's

// seconds <-> ticks through a sample's tempo changes ([tick, quarter notes per minute]; 120 until the first)
function timeline(tempos, ticksPerBeat) {
  const changes = tempos.length && tempos[0][0] === 0 ? tempos : [[0, 120], ...tempos];
  const segments = []; // [first tick, seconds there, seconds per tick]
  for (const [tick, qpm] of changes) {
    const last = segments[segments.length - 1];
    segments.push([tick, last ? last[1] + (tick - last[0]) * last[2] : 0, 60 / qpm / ticksPerBeat]);
  }
  const segment = (at, value) => segments.findLast((s) => s[at] <= value) || segments[0];
  return {
    seconds: (tick) => { const [t, s, k] = segment(0, tick); return s + (tick - t) * k; },
    tick: (seconds) => { const [t, s, k] = segment(1, seconds); return t + (seconds - s) / k; },
  };
}

// a MIDI channel per track: drums on the drum channel, the others on the rest in turn
function channelsOf(tracks) {
  const pitched = [...Array(16).keys()].filter((c) => c !== DRUM_CHANNEL);
  let next = 0;
  return tracks.map(([, drum]) => (drum ? DRUM_CHANNEL : pitched[next++ % pitched.length]));
}

// What a player is asked to do: play `sample` (notes, tracks, tempos) from tick `begin` to its end
// or, with `loopEnd`, on to `loopEnd` and then from `from` to `loopEnd` again and again.
// `position()`: the tick heard now, null once it has ended.
class SynthPlayer {
  static async load() {
    const { WorkletSynthesizer } = await import("/vendor/spessasynth_lib/index.js");
    const context = new AudioContext();
    await context.audioWorklet.addModule("/vendor/spessasynth_lib/spessasynth_processor.min.js");
    const synth = new WorkletSynthesizer(context);
    const volume = context.createGain();
    synth.connect(volume);
    volume.connect(context.destination);
    const soundfont = await fetch("/sound/soundfont.sf2");
    if (!soundfont.ok) throw new Error(`the soundfont could not be loaded (the server answered ${soundfont.status})`);
    await synth.soundBankManager.addSoundBank(await soundfont.arrayBuffer(), "gm");
    await synth.isReady;
    return new SynthPlayer(context, synth, volume);
  }

  constructor(context, synth, volume) {
    Object.assign(this, { context, synth, volume, play: null, passes: [], offs: [], until: 0, timer: null });
    // a page may start its sound only after a gesture: the first one wakes the context, so that Play is instant
    const wake = () => context.resume();
    document.addEventListener("pointerdown", wake, { once: true });
    document.addEventListener("keydown", wake, { once: true });
  }

  // starts playing; returns the context time of the first note
  async start(sample, time, { from, begin, loopEnd }) {
    if (this.context.state !== "running") await this.context.resume();
    const at = this.silence();
    const channels = channelsOf(sample.tracks);
    sample.tracks.forEach(([program, drum], i) => drum || this.synth.programChange(channels[i], program, { time: at }));
    const end = loopEnd ?? Math.max(...sample.notes.map((n) => n[1]));
    this.play = { sample, time, channels, from, end, loop: loopEnd != null };
    const first = this.turn(Math.max(at, this.context.currentTime + LEAD), begin);
    this.handOver();
    this.timer = setInterval(() => this.handOver(), HAND_OVER_EVERY);
    return first.queue.length ? first.at(Math.max(first.queue[0][0], begin)) : first.t0;
  }

  // one pass from tick `begin` to the end, heard from context time t0: the notes sounding in it, by onset
  turn(t0, begin) {
    const { sample, time, end } = this.play;
    const queue = sample.notes.filter((n) => n[1] > begin && n[0] < end);
    const pass = { t0, begin, queue, next: 0, at: (tick) => t0 + time.seconds(tick) - time.seconds(begin) };
    this.passes = [...this.passes.slice(-1), pass];
    return pass;
  }

  // hands the synthesiser the notes on and off up to LOOKAHEAD from now
  handOver() {
    const horizon = this.context.currentTime + LOOKAHEAD;
    const { play, synth } = this;
    for (let pass = this.passes[this.passes.length - 1]; pass; ) {
      for (let n; (n = pass.queue[pass.next]) && pass.at(Math.max(n[0], pass.begin)) < horizon; pass.next++) {
        const channel = play.channels[n[3]];
        synth.noteOn(channel, n[2], n[5], { time: pass.at(Math.max(n[0], pass.begin)) });
        this.offs.push([pass.at(Math.min(n[1], play.end)), channel, n[2]]);
      }
      const ends = pass.at(play.end);
      pass = ends < horizon && play.loop ? this.turn(ends, play.from) : null;
    }
    // note-offs only up to the horizon too, so that nothing is left to end a later note
    this.offs = this.offs.filter(([at, channel, pitch]) => (at < horizon ? synth.noteOff(channel, pitch, { time: at }) : true));
    this.until = horizon;
  }

  // ends what is playing: what was handed over is muted now and cut where it ends; returns that time
  silence() {
    clearInterval(this.timer);
    const now = this.context.currentTime, at = Math.max(now, this.until);
    this.volume.gain.cancelScheduledValues(now);
    this.volume.gain.setValueAtTime(0, now);
    for (let channel = 0; channel < 16; channel++) this.synth.controllerChange(channel, 120, 0, { time: at }); // all sound off
    this.volume.gain.setValueAtTime(1, at);
    this.passes = []; this.offs = []; this.play = null;
    return at;
  }

  stop() { this.silence(); }

  position() {
    if (!this.play) return null;
    const now = this.context.currentTime, { end, loop, time } = this.play;
    const pass = this.passes.findLast((p) => p.t0 <= now) || this.passes[0];
    const tick = time.tick(time.seconds(pass.begin) + Math.max(0, now - pass.t0));
    if (tick < end) return tick;
    if (!loop) this.stop(); // played to its end
    return loop ? end : null;
  }

  // performance.now() at which what the context plays at `contextTime` is heard
  heardAt(contextTime) {
    const latency = this.context.outputLatency || this.context.baseLatency || 0;
    return performance.now() + (contextTime - this.context.currentTime + latency) * 1000;
  }
}

// The server's WAV in an <audio> element, for a page whose synthesiser could not be loaded.
class WavPlayer {
  constructor(audio, onError) {
    Object.assign(this, { audio, play: null });
    audio.addEventListener("timeupdate", () => {
      const play = this.play;
      if (play && play.loopEnd != null && play.time.tick(audio.currentTime) >= play.loopEnd) {
        audio.currentTime = play.time.seconds(play.from);
      }
    });
    audio.addEventListener("ended", () => { this.play = null; });
    audio.addEventListener("error", () => { if (this.play) { this.play = null; onError(); } });
  }

  async start(sample, time, { from, begin, loopEnd, wav }) {
    this.play = { time, from, begin, loopEnd };
    if (!this.audio.src.endsWith(wav)) this.audio.src = wav;
    this.audio.currentTime = time.seconds(begin);
    await this.audio.play().catch(() => {}); // an error is reported by the element's "error" event
  }

  stop() { this.play = null; this.audio.pause(); }

  position() {
    if (!this.play) return null;
    return this.audio.paused ? this.play.begin : this.play.time.tick(this.audio.currentTime);
  }
}

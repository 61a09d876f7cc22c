// Runs first in every sandbox engine. It turns the native `__host` object into the few standard
// globals Pyodide touches while booting and running (docs/architecture.md §2), then removes `__host` from
// the global scope so user code reaches the host only through these wrappers.
(function () {
  "use strict";
  const host = globalThis.__host;
  delete globalThis.__host;
  const define = (obj, name, value) =>
    Object.defineProperty(obj, name, { value, writable: true, configurable: true, enumerable: false });

  // --- Lone UTF-16 surrogates cannot cross to the host as text: escape them `\udcxx` style,
  // as Python's backslashreplace does, so that no line is dropped or fatal.
  const LONE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;
  const wellFormed = (s) => s.replace(LONE, (c) => "\\u" + c.charCodeAt(0).toString(16));
  // One message to the host: a JSON list of [stream, line] pairs, output of the running call
  // (the host drops it when no call runs, and the front counts it against the output cap).
  const emitLines = (stream, text) => {
    const lines = String(text).split("\n").map((l) => [stream, wellFormed(l)]);
    host.emit(JSON.stringify(lines));
  };

  // --- console: user code's console is part of the call's output (log/info/debug/trace on
  // stdout, warn/error on stderr); it never reaches the server's own log.
  const fmt = (args) =>
    args
      .map((a) => {
        if (typeof a === "string") return a;
        if (a instanceof Error) return `${a}\n${a.stack || ""}`;
        try { return JSON.stringify(a); } catch (_) { return String(a); }
      })
      .join(" ");
  const console = {};
  for (const level of ["log", "info", "debug", "trace"]) {
    console[level] = (...args) => emitLines("stdout", fmt(args));
  }
  for (const level of ["warn", "error"]) {
    console[level] = (...args) => emitLines("stderr", fmt(args));
  }
  define(globalThis, "console", console);

  // --- time and timers, driven by the host event loop.
  define(globalThis, "performance", { now: () => host.now(), timeOrigin: Date.now() });
  const intervals = new Map();
  define(globalThis, "setTimeout", (fn, ms, ...args) =>
    host.setTimer(() => (typeof fn === "function" ? fn(...args) : undefined), ms || 0));
  define(globalThis, "clearTimeout", (id) => { if (id !== undefined) host.clearTimer(id); });
  define(globalThis, "setInterval", (fn, ms, ...args) => {
    const key = {};
    const tick = () => { intervals.set(key, host.setTimer(tick, ms || 0)); fn(...args); };
    intervals.set(key, host.setTimer(tick, ms || 0));
    return key;
  });
  define(globalThis, "clearInterval", (key) => {
    if (intervals.has(key)) { host.clearTimer(intervals.get(key)); intervals.delete(key); }
  });
  define(globalThis, "queueMicrotask", (fn) => { Promise.resolve().then(fn); });

  // --- randomness: always from the OS (getrandom), never Math.random.
  const fillRandom = (view) => {
    const bytes = new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
    for (let off = 0; off < bytes.length; off += 65536) {
      const n = Math.min(65536, bytes.length - off);
      bytes.set(new Uint8Array(host.randomBytes(n)), off);
    }
    return view;
  };
  define(globalThis, "crypto", { getRandomValues: fillRandom });
  const B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const toBase64 = (bytes) => {
    let out = "";
    for (let i = 0; i < bytes.length; i += 3) {
      const n = (bytes[i] << 16) | ((bytes[i + 1] || 0) << 8) | (bytes[i + 2] || 0);
      out += B64[(n >> 18) & 63] + B64[(n >> 12) & 63] +
        (i + 1 < bytes.length ? B64[(n >> 6) & 63] : "=") + (i + 2 < bytes.length ? B64[n & 63] : "=");
    }
    return out;
  };
  define(globalThis, "btoa", (text) => {
    const s = String(text);
    const bytes = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) {
      const c = s.charCodeAt(i);
      if (c > 255) throw new Error("btoa: the string contains characters outside Latin-1");
      bytes[i] = c;
    }
    return toBase64(bytes);
  });
  define(globalThis, "atob", (b64) => {
    const s = String(b64).replace(/[\t\n\f\r ]/g, "").replace(/=+$/, "");
    let out = "", bits = 0, acc = 0;
    for (const ch of s) {
      const v = B64.indexOf(ch);
      if (v < 0) throw new Error("atob: invalid base64");
      acc = (acc << 6) | v; bits += 6;
      if (bits >= 8) { bits -= 8; out += String.fromCharCode((acc >> bits) & 255); }
    }
    return out;
  });

  // --- UTF-8 text encoding, in JavaScript (no native view of WebAssembly memory is taken).
  class TextEncoder {
    get encoding() { return "utf-8"; }
    encode(input = "") {
      const s = String(input);
      const out = new Uint8Array(s.length * 3);
      let j = 0;
      for (let i = 0; i < s.length; i++) {
        let c = s.charCodeAt(i);
        if (c < 0x80) { out[j++] = c; continue; }
        if (c >= 0xd800 && c < 0xdc00 && i + 1 < s.length) {
          const d = s.charCodeAt(i + 1);
          if (d >= 0xdc00 && d < 0xe000) { c = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00); i++; }
          else c = 0xfffd;
        } else if (c >= 0xd800 && c < 0xe000) c = 0xfffd;
        if (c < 0x800) { out[j++] = 0xc0 | (c >> 6); out[j++] = 0x80 | (c & 63); }
        else if (c < 0x10000) { out[j++] = 0xe0 | (c >> 12); out[j++] = 0x80 | ((c >> 6) & 63); out[j++] = 0x80 | (c & 63); }
        else { out[j++] = 0xf0 | (c >> 18); out[j++] = 0x80 | ((c >> 12) & 63); out[j++] = 0x80 | ((c >> 6) & 63); out[j++] = 0x80 | (c & 63); }
      }
      return out.slice(0, j);
    }
    encodeInto(input, dest) {
      const bytes = this.encode(input);
      const n = Math.min(bytes.length, dest.length);
      dest.set(bytes.subarray(0, n));
      return { read: String(input).length, written: n };
    }
  }
  class TextDecoder {
    constructor(label = "utf-8", options = {}) {
      const l = String(label).toLowerCase();
      if (l === "utf-16le" || l === "utf-16") this.utf16 = true;
      else if (["latin1", "latin-1", "iso-8859-1", "ascii", "us-ascii", "windows-1252"].includes(l)) this.latin1 = true;
      else if (l !== "utf-8" && l !== "utf8") throw new RangeError(`TextDecoder: unsupported encoding ${label}`);
      this.fatal = !!options.fatal;
    }
    get encoding() { return this.utf16 ? "utf-16le" : this.latin1 ? "windows-1252" : "utf-8"; }
    decode(input) {
      if (input === undefined) return "";
      const b = input instanceof ArrayBuffer ? new Uint8Array(input)
        : new Uint8Array(input.buffer, input.byteOffset, input.byteLength);
      if (this.latin1) {
        const parts = [];
        for (let i = 0; i < b.length; i += 8192) parts.push(String.fromCharCode.apply(null, b.subarray(i, i + 8192)));
        return parts.join("");
      }
      if (this.utf16) {
        const parts = [];
        for (let i = 0; i + 1 < b.length; i += 16384) {
          const end = Math.min(b.length - 1, i + 16384);
          const units = [];
          for (let j = i; j + 1 <= end; j += 2) units.push(b[j] | (b[j + 1] << 8));
          parts.push(String.fromCharCode.apply(null, units));
        }
        return parts.join("");
      }
      const parts = [];
      let units = [];
      const bad = () => { if (this.fatal) throw new TypeError("The encoded data was not valid utf-8"); units.push(0xfffd); };
      for (let i = 0; i < b.length;) {
        const c = b[i];
        if (c < 0x80) { units.push(c); i++; }
        else {
          let need, cp;
          if (c >= 0xc2 && c < 0xe0) { need = 1; cp = c & 31; }
          else if (c >= 0xe0 && c < 0xf0) { need = 2; cp = c & 15; }
          else if (c >= 0xf0 && c < 0xf5) { need = 3; cp = c & 7; }
          else { bad(); i++; continue; }
          let k = 1;
          for (; k <= need && i + k < b.length && (b[i + k] & 0xc0) === 0x80; k++) cp = (cp << 6) | (b[i + k] & 63);
          if (k <= need || (need === 2 && cp < 0x800) || (need === 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
              (cp >= 0xd800 && cp < 0xe000)) { bad(); i += k > 1 ? k : 1; continue; }
          i += need + 1;
          if (cp >= 0x10000) { cp -= 0x10000; units.push(0xd800 + (cp >> 10), 0xdc00 + (cp & 1023)); }
          else units.push(cp);
        }
        if (units.length >= 8192) { parts.push(String.fromCharCode.apply(null, units)); units = []; }
      }
      parts.push(String.fromCharCode.apply(null, units));
      return parts.join("");
    }
  }
  define(globalThis, "TextEncoder", TextEncoder);
  define(globalThis, "TextDecoder", TextDecoder);

  // --- Pyodide's "shell" runtime reads its files with read/readbuffer; serve the virtual files.
  define(globalThis, "readbuffer", (path) => host.readFile(String(path)));
  define(globalThis, "read", (path, mode) => {
    const buf = host.readFile(String(path));
    return mode === "binary" ? new Uint8Array(buf) : new TextDecoder().decode(buf);
  });
  define(globalThis, "load", (path) => { throw new Error(`load(${path}) is not available`); });

  // --- WebAssembly: under the embedding API the asynchronous compile/instantiate promises never
  // settle, so compile synchronously and hand back settled promises.
  const WA = globalThis.WebAssembly;
  define(WA, "compile", (bytes) => {
    try { return Promise.resolve(new WA.Module(bytes)); } catch (e) { return Promise.reject(e); }
  });
  define(WA, "instantiate", (source, imports) => {
    try {
      if (source instanceof WA.Module) return Promise.resolve(new WA.Instance(source, imports));
      const module = new WA.Module(source);
      return Promise.resolve({ module, instance: new WA.Instance(module, imports) });
    } catch (e) {
      return Promise.reject(e);
    }
  });
  delete WA.compileStreaming;
  delete WA.instantiateStreaming;

  // --- WebAssembly.Table: grown with room ahead while Pyodide boots, not one entry at a time.
  // JavaScriptCore reallocates a table's storage to the exact new size on every `grow`, and
  // Emscripten's dynamic linking adds each of Pyodide's ~6,000 exported functions that is not
  // yet in the table with its own `grow(1)` (`updateGOT`): ~90 ms of every boot, quadratic in
  // the table's size. A table grown through here gets room ahead (as many entries again as it
  // has, at most TABLE_ROOM_MAX_ENTRIES), and `length`, `grow`, `get` and `set` answer for the
  // entries handed out only, so JavaScript sees the same indexes as before: a memory snapshot
  // holds them. WebAssembly code sees the real size (`table.size`), which Pyodide's never asks;
  // should it grow the table itself, the room is given up and the real size is the length again.
  // The runner ends this once the boot is done (`endTableRoom`): calls then meet the plain
  // methods (`_PyEM_TrampolineCall_JS` may call `Table.get` for every Python call), and what
  // room is left stays unused.
  const TABLE_ROOM_MAX_ENTRIES = 1 << 16;
  const Table = WA.Table.prototype;
  const plainDescriptors = Object.getOwnPropertyDescriptors(Table);
  const plain = { grow: Table.grow, get: Table.get, set: Table.set };
  const realLength = plainDescriptors.length.get;
  // Replaces a method or accessor keeping its attributes (enumerable, …).
  const replace = (name, part) => Object.defineProperty(Table, name, { ...plainDescriptors[name], ...part });
  // table → { visible, real }: the length handed out and the real one, for tables with room.
  const roomy = new WeakMap();
  const visibleLength = (table) => {
    const real = realLength.call(table);
    const room = roomy.get(table);
    if (room === undefined) return real;
    if (room.real === real) return room.visible;
    roomy.delete(table);
    return real;
  };
  const checkIndex = (table, index) => {
    if (roomy.has(table) && Number(index) >= visibleLength(table)) {
      throw new RangeError("WebAssembly.Table index is out of bounds");
    }
  };
  replace("length", { get() { return visibleLength(this); } });
  replace("grow", { value: function grow(delta, ...init) {
    if (typeof delta !== "number" || !Number.isSafeInteger(delta) || delta < 0) {
      // Whatever the spec makes of it (ToIndex), from the real size: the room is given up.
      roomy.delete(this);
      return plain.grow.call(this, delta, ...init);
    }
    const old = visibleLength(this);
    let real = realLength.call(this);
    if (old + delta > real) {
      const needed = old + delta - real;
      try {
        plain.grow.call(this, Math.max(needed, Math.min(real, TABLE_ROOM_MAX_ENTRIES)));
      } catch (_) {
        // Near the table's maximum: exactly what was asked, or the spec's RangeError.
        plain.grow.call(this, needed);
      }
      real = realLength.call(this);
    }
    roomy.set(this, { visible: old + delta, real });
    if (init.length > 0) {
      for (let i = old; i < old + delta; i++) plain.set.call(this, i, init[0]);
    }
    return old;
  } });
  replace("get", { value: function get(index) {
    checkIndex(this, index);
    return plain.get.call(this, index);
  } });
  replace("set", { value: function set(index, ...value) {
    checkIndex(this, index);
    return plain.set.call(this, index, ...value);
  } });
  const endTableRoom = () => {
    for (const name of ["length", "grow", "get", "set"]) {
      Object.defineProperty(Table, name, plainDescriptors[name]);
    }
  };

  // runtime/js/fetch.js takes this one and removes it.
  define(globalThis, "__mcpHostCall", host.call);

  // The runner (runtime/js/runner.js) reaches the host through this frozen, non-enumerable handle and
  // deletes it before any user code runs.
  define(globalThis, "__mcpHost", Object.freeze({ emit: host.emit, done: host.done, emitLines, endTableRoom }));
})();

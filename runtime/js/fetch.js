// `fetch` and friends for user code (pyodide.http.pyfetch, open_url, pyxhr). Requests go to the
// front through a synchronous host call (`fetch`'s made at once go together, through
// `fetch_many`); the front performs them only for hosts named with --allow-net and answers
// everything else with a network error. Minimal, standard-shaped
// versions of Headers, Request, Response, AbortController/AbortSignal and a synchronous-only
// XMLHttpRequest.
(function () {
  "use strict";
  const hostCall = globalThis.__mcpHostCall;
  delete globalThis.__mcpHostCall;
  const define = (name, value) =>
    Object.defineProperty(globalThis, name, { value, writable: true, configurable: true, enumerable: false });
  const toBytes = (body) => {
    if (body === undefined || body === null) return undefined;
    if (typeof body === "string") return new TextEncoder().encode(body);
    if (body instanceof ArrayBuffer) return new Uint8Array(body.slice(0));
    if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer.slice(body.byteOffset, body.byteOffset + body.byteLength));
    return new TextEncoder().encode(String(body));
  };

  class Headers {
    constructor(init) {
      this._map = new Map();
      if (init instanceof Headers) init.forEach((v, k) => this.append(k, v));
      else if (Array.isArray(init)) init.forEach(([k, v]) => this.append(k, v));
      else if (init && typeof init === "object") Object.keys(init).forEach((k) => this.append(k, init[k]));
    }
    append(k, v) { k = String(k).toLowerCase(); const old = this._map.get(k); this._map.set(k, old === undefined ? String(v) : `${old}, ${v}`); }
    set(k, v) { this._map.set(String(k).toLowerCase(), String(v)); }
    get(k) { const v = this._map.get(String(k).toLowerCase()); return v === undefined ? null : v; }
    has(k) { return this._map.has(String(k).toLowerCase()); }
    delete(k) { this._map.delete(String(k).toLowerCase()); }
    forEach(fn, thisArg) { for (const [k, v] of this._map) fn.call(thisArg, v, k, this); }
    *entries() { yield* this._map.entries(); }
    *keys() { yield* this._map.keys(); }
    *values() { yield* this._map.values(); }
    [Symbol.iterator]() { return this.entries(); }
  }

  class AbortSignal {
    constructor() { this.aborted = false; this.reason = undefined; this.onabort = null; this._listeners = []; }
    addEventListener(type, fn) { if (type === "abort") this._listeners.push(fn); }
    removeEventListener(type, fn) { this._listeners = this._listeners.filter((f) => f !== fn); }
    throwIfAborted() { if (this.aborted) throw this.reason; }
    _abort(reason) {
      if (this.aborted) return;
      this.aborted = true;
      this.reason = reason === undefined ? new Error("The operation was aborted.") : reason;
      const event = { type: "abort", target: this };
      if (typeof this.onabort === "function") this.onabort(event);
      for (const fn of this._listeners.slice()) fn(event);
    }
    static abort(reason) { const s = new AbortSignal(); s._abort(reason); return s; }
    static any(signals) {
      const s = new AbortSignal();
      for (const o of signals) { if (o.aborted) { s._abort(o.reason); break; } o.addEventListener("abort", () => s._abort(o.reason)); }
      return s;
    }
  }
  class AbortController {
    constructor() { this.signal = new AbortSignal(); }
    abort(reason) { this.signal._abort(reason); }
  }

  class Body {
    _initBody(bytes) { this._bytes = bytes || new Uint8Array(0); this.bodyUsed = false; }
    _consume() {
      if (this.bodyUsed) return Promise.reject(new TypeError("Body has already been consumed."));
      this.bodyUsed = true;
      return Promise.resolve(this._bytes);
    }
    arrayBuffer() { return this._consume().then((b) => b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)); }
    bytes() { return this._consume().then((b) => new Uint8Array(b)); }
    text() { return this._consume().then((b) => new TextDecoder().decode(b)); }
    json() { return this.text().then((t) => JSON.parse(t)); }
  }

  class Request extends Body {
    constructor(input, init = {}) {
      super();
      const base = input instanceof Request ? input : null;
      this.url = base ? base.url : String(input);
      if (!/^https?:\/\//i.test(this.url)) throw new TypeError(`Failed to construct Request: unsupported URL ${this.url}`);
      this.method = String(init.method || (base && base.method) || "GET").toUpperCase();
      this.headers = new Headers(init.headers || (base && base.headers));
      this.signal = init.signal || (base && base.signal) || new AbortSignal();
      this.redirect = init.redirect || (base && base.redirect) || "follow";
      this._initBody(init.body !== undefined ? toBytes(init.body) : base ? base._bytes : undefined);
    }
    clone() { return new Request(this); }
  }

  class Response extends Body {
    constructor(body, init = {}) {
      super();
      this._initBody(toBytes(body));
      this.status = init.status === undefined ? 200 : init.status;
      this.statusText = init.statusText || "";
      this.headers = new Headers(init.headers);
      this.url = init.url || "";
      this.redirected = !!init.redirected;
      this.type = "basic";
      this.ok = this.status >= 200 && this.status < 300;
    }
    clone() {
      if (this.bodyUsed) throw new TypeError("Response body is already used");
      return new Response(this._bytes.slice(), this);
    }
  }

  // The network error of a refusal or a failure, in the front's words.
  const networkError = (words) => new TypeError(`NetworkError when attempting to fetch resource: ${words}`);
  // One request through the host: {method, url, headers} and the body in, the answer out.
  const sendOnce = (method, url, headers, bytes) => {
    const out = hostCall(JSON.stringify({ op: "fetch", request: { method, url, headers: [...headers.entries()] } }), bytes);
    const meta = JSON.parse(out.json);
    if (meta.error) throw networkError(meta.error);
    return { meta, body: new Uint8Array(out.body) };
  };
  // Requests made at once ([{method, url, headers, bytes}]) through one host call, which the
  // front makes together; an answer ({meta, body}, or {error}) per request, in order.
  const sendMany = (hops) => {
    const requests = hops.map(({ method, url, headers }) => ({ method, url, headers: [...headers.entries()] }));
    const sizes = hops.map(({ bytes }) => (bytes ? bytes.length : 0));
    const bodies = new Uint8Array(sizes.reduce((a, b) => a + b, 0));
    let at = 0;
    hops.forEach(({ bytes }) => { if (bytes) { bodies.set(bytes, at); at += bytes.length; } });
    const out = hostCall(JSON.stringify({ op: "fetch_many", requests, sizes }), bodies);
    const answer = JSON.parse(out.json);
    const received = new Uint8Array(out.body);
    let offset = 0;
    return answer.responses.map((meta, k) => {
      const body = received.slice(offset, offset + answer.sizes[k]);
      offset += answer.sizes[k];
      return meta.error ? { error: networkError(meta.error) } : { meta, body };
    });
  };
  // The Fetch standard's redirect statuses, and the most it follows in a row.
  const REDIRECTS = new Set([301, 302, 303, 307, 308]);
  const MAX_REDIRECTS = 20;
  // `location` (a redirect's, absolute or relative) against the URL `base` that answered.
  const resolve = (base, location) => {
    if (/^https?:\/\//i.test(location)) return location;
    const [, scheme, authority, path] = /^(https?:)\/\/([^/?#]*)([^?#]*)/i.exec(base);
    if (location.startsWith("//")) return scheme + location;
    if (location.startsWith("/")) return `${scheme}//${authority}${location}`;
    if (location.startsWith("?")) return `${scheme}//${authority}${path}${location}`;
    return `${scheme}//${authority}${path.replace(/[^/]*$/, "")}${location}`;
  };
  // A request, its redirects followed as a browser follows them (`redirect` "follow"; "error"
  // refuses one, "manual" hands it back): each hop is a request of its own, which the host
  // checks against --allow-net again. A 303, and a 301 or 302 after a POST, go on as a GET
  // without a body.
  const send = (method, url, headers, bytes, redirect = "follow") => {
    let hop = { method, url, headers, bytes, redirect, hops: 0 };
    for (;;) {
      const answer = sendOnce(hop.method, hop.url, hop.headers, hop.bytes);
      const next = afterHop(hop, answer);
      if (next.done) return next.done;
      hop = next.hop;
    }
  };
  // What comes of `answer`, the answer to `hop` ({method, url, headers, bytes, redirect,
  // hops}): `{done}` (the answer, marked redirected when it came after hops) or `{hop}` (the
  // redirect's next request); throws for a redirect the mode refuses, or one too many.
  const afterHop = (hop, answer) => {
    answer.meta.redirected = hop.hops > 0;
    const location = answer.meta.headers.find(([k]) => k === "location");
    if (!REDIRECTS.has(answer.meta.status) || !location || hop.redirect === "manual") return { done: answer };
    if (hop.redirect === "error") {
      throw networkError(`redirected to ${location[1]}, and the request's redirect mode is "error"`);
    }
    if (hop.hops >= MAX_REDIRECTS) throw networkError(`more than ${MAX_REDIRECTS} redirects`);
    const next = { ...hop, url: resolve(answer.meta.url || hop.url, location[1]), hops: hop.hops + 1 };
    if ((answer.meta.status === 303 && hop.method !== "HEAD") || ([301, 302].includes(answer.meta.status) && hop.method === "POST")) {
      next.method = "GET";
      next.bytes = undefined;
    }
    return { hop: next };
  };

  // Requests of `fetch` wait here ({hop, resolve, reject}) for the next flush, which sends
  // them together, at most `atOnce` a host call (the run's --max-concurrent-fetches, which
  // runtime/js/runner.js sets through `__mcpFetchLimit`, taken off the global before user code
  // runs; the front refuses a larger batch anyway). So pyfetch calls that asyncio tasks make
  // (asyncio.gather) are in flight together, as httpx's are.
  let atOnce = 1;
  let queued = [];
  define("__mcpFetchLimit", (n) => { atOnce = Math.max(1, Number(n) || 1); });
  const flush = () => {
    let pending = queued;
    queued = [];
    while (pending.length) {
      const part = pending.slice(0, atOnce);
      pending = pending.slice(atOnce);
      let answers;
      try {
        answers = part.length === 1 ? [sendOnceAnswer(part[0].hop)] : sendMany(part.map((p) => p.hop));
      } catch (e) {
        part.forEach((p) => p.reject(e));
        continue;
      }
      part.forEach((p, k) => {
        if (answers[k].error) return p.reject(answers[k].error);
        try {
          const next = afterHop(p.hop, answers[k]);
          if (next.done) return p.resolve(next.done);
          pending.push({ ...p, hop: next.hop });
        } catch (e) {
          p.reject(e);
        }
      });
    }
  };
  // sendOnce's answer as sendMany gives one: a refusal as `{error}` rather than thrown.
  const sendOnceAnswer = ({ method, url, headers, bytes }) => {
    try {
      return sendOnce(method, url, headers, bytes);
    } catch (e) {
      return { error: e };
    }
  };

  const fetch = (input, init) => {
    try {
      const req = input instanceof Request && init === undefined ? input : new Request(input, init || {});
      if (req.signal.aborted) return Promise.reject(req.signal.reason);
      const hop = { method: req.method, url: req.url, headers: req.headers, bytes: req._bytes.length ? req._bytes : undefined, redirect: req.redirect, hops: 0 };
      return new Promise((resolve, reject) => {
        const answered = ({ meta, body }) => resolve(new Response(body, {
          status: meta.status, statusText: meta.statusText, headers: meta.headers, url: meta.url, redirected: meta.redirected,
        }));
        queued.push({ hop, resolve: answered, reject });
        if (queued.length === 1) setTimeout(flush, 0);
      });
    } catch (e) {
      return Promise.reject(e);
    }
  };

  class XMLHttpRequest {
    constructor() { this.readyState = 0; this.status = 0; this.statusText = ""; this.responseType = ""; this._headers = new Headers(); }
    open(method, url, async = true) {
      if (async !== false) throw new Error("XMLHttpRequest: only synchronous requests are available in the sandbox");
      this._method = String(method).toUpperCase(); this._url = String(url); this.readyState = 1;
    }
    setRequestHeader(k, v) { this._headers.append(k, v); }
    overrideMimeType() {}
    send(body) {
      const { meta, body: bytes } = send(this._method, this._url, this._headers, toBytes(body));
      this.status = meta.status; this.statusText = meta.statusText; this.responseURL = meta.url;
      this._responseHeaders = new Headers(meta.headers);
      this.responseText = new TextDecoder().decode(bytes);
      this.response = this.responseType === "arraybuffer" ? bytes.buffer : this.responseText;
      this.readyState = 4;
    }
    getResponseHeader(k) { return this._responseHeaders ? this._responseHeaders.get(k) : null; }
    getAllResponseHeaders() {
      if (!this._responseHeaders) return "";
      return [...this._responseHeaders.entries()].map(([k, v]) => `${k}: ${v}\r\n`).join("");
    }
  }

  define("Headers", Headers);
  define("Request", Request);
  define("Response", Response);
  define("AbortController", AbortController);
  define("AbortSignal", AbortSignal);
  define("fetch", fetch);
  define("XMLHttpRequest", XMLHttpRequest);
})();

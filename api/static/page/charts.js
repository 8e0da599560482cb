// Charts drawn by uPlot (vendored beside this file, MIT, see uplot.LICENSE; loaded by a
// plain <script> as window.uPlot): hover shows each series' value at a step, dragging
// across a chart zooms it (double-click zooms out), and the page's smoothing and log
// scale controls apply to every chart. Markers (restarts and the steps they rolled back
// to, pauses, checkpoints) are drawn on the charts that ask for them.

const HEIGHT = 200;
const MARK_COLORS = { restart: "#c0392b", pause: "#b7791f", checkpoint: "#1f8a4c" };

// TensorBoard's smoothing: an exponential moving average, debiased at the start, over the
// points that exist (a gap stays a gap).
export function smooth(values, weight) {
  if (!weight) return values;
  let last = 0;
  let n = 0;
  return values.map((v) => {
    if (v === null || !Number.isFinite(v)) return null;
    last = last * weight + (1 - weight) * v;
    n += 1;
    return last / (1 - weight ** n);
  });
}

function drawMarks(u, marks) {
  const { ctx } = u;
  const { left, top, width, height } = u.bbox;
  const at = (step) => Math.round(u.valToPos(step, "x", true));
  ctx.save();
  for (const mark of marks) {
    const x = at(mark.step);
    if (x < left || x > left + width) continue;
    ctx.strokeStyle = MARK_COLORS[mark.kind];
    ctx.fillStyle = MARK_COLORS[mark.kind];
    if (mark.kind === "restart" && mark.from !== undefined && mark.from < mark.step) {
      // The steps trained again: from the step restored to the step it failed near.
      ctx.globalAlpha = 0.12;
      const from = Math.max(left, at(mark.from));
      ctx.fillRect(from, top, x - from, height);
      ctx.globalAlpha = 1;
    }
    ctx.lineWidth = mark.kind === "checkpoint" ? 1 : 2 * devicePixelRatio;
    ctx.setLineDash(mark.kind === "checkpoint" ? [3 * devicePixelRatio, 3 * devicePixelRatio] : []);
    ctx.beginPath();
    ctx.moveTo(x, top);
    ctx.lineTo(x, top + height);
    ctx.stroke();
  }
  ctx.restore();
}

export class Chart {
  // series: [{ key, label, color, scale }]; `value(row, key)` reads a row's value;
  // `bytes`: the values are bytes, labelled in the unit their size needs.
  constructor(box, series, { value = (row, key) => row[key], marked = false, bytes = false } = {}) {
    this.box = box;
    this.series = series;
    this.value = value;
    this.bytes = bytes;
    this.marked = marked;
    this.plot = null;
    this.log = false;
    this.zoomed = false;
    this.rows = [];
    this.marks = [];
    this.smoothing = 0;
    box.replaceChildren();
    this.empty = document.createElement("p");
    this.empty.className = "no-data";
    box.append(this.empty);
    box.addEventListener("dblclick", () => { this.zoomed = false; });
    // Made while its section was hidden, a chart has no width yet: it is drawn once it has.
    this.observer = new ResizeObserver(() => this.resize());
    this.observer.observe(box);
  }

  update(rows, { smoothing = 0, log = false, marks = [], ended = false } = {}) {
    this.rows = rows;
    this.marks = this.marked ? marks : [];
    this.ended = ended;
    if (log !== this.log) this.destroy();
    this.log = log;
    this.smoothing = smoothing;
    this.draw();
  }

  data() {
    const rows = this.rows.filter((r) => this.series.some((s) => finite(this.value(r, s.key))));
    const xs = rows.map((r) => r.step);
    const ys = this.series.map((s) => {
      const raw = rows.map((r) => (finite(this.value(r, s.key)) ? this.value(r, s.key) : null));
      // A log scale cannot show 0 or less: such points become gaps.
      const shown = this.log ? raw.map((v) => (v > 0 ? v : null)) : raw;
      return smooth(shown, this.smoothing);
    });
    return [xs, ...ys];
  }

  draw() {
    const data = this.data();
    const count = data[0].length;
    this.box.dataset.points = String(count);
    this.box.dataset.markers = String(this.marks.length);
    this.empty.hidden = count > 0;
    this.empty.textContent = this.ended ? "nothing was logged" : "no data yet";
    if (count === 0 || this.box.clientWidth === 0) return;
    if (this.plot === null) {
      this.plot = new window.uPlot(this.options(), data, this.box);
      return;
    }
    // Zoomed in: new points arrive without taking the zoom away.
    this.plot.setData(data, !this.zoomed);
  }

  options() {
    return {
      width: this.box.clientWidth,
      height: HEIGHT,
      cursor: { drag: { x: true, y: false }, points: { size: 6 } },
      scales: { x: { time: false }, y: { distr: this.log ? 3 : 1 } },
      axes: [
        { label: "step", size: 36 },
        {
          values: (u, splits, axis, space, incr) =>
            this.bytes ? byteTicks(splits, incr) : splits.map((v) => tick(v, incr)),
          // As wide as its longest label (about 7 px a character at the axis font).
          size: (u, values) => 16 + 7 * Math.max(4, ...(values ?? []).map((v) => v.length)),
        },
      ],
      series: [
        { label: "step" },
        ...this.series.map((s) => ({
          label: s.label, stroke: s.color, width: 2, spanGaps: true, points: { show: false },
        })),
      ],
      hooks: {
        draw: [(u) => drawMarks(u, this.marks)],
        setSelect: [(u) => { if (u.select.width > 0) this.zoomed = true; }],
        // The steps shown, for whoever reads the page (and its tests) without the canvas.
        setScale: [(u, key) => {
          if (key === "x") this.box.dataset.steps = `${u.scales.x.min}-${u.scales.x.max}`;
        }],
      },
    };
  }

  resize() {
    const width = this.box.clientWidth;
    if (width === 0) return;
    if (this.plot === null) this.draw();
    else if (width !== this.plot.width) this.plot.setSize({ width, height: HEIGHT });
  }

  destroy() {
    this.plot?.destroy();
    this.plot = null;
    this.zoomed = false;  // a new plot shows everything
  }

  // For good: another chart takes this one's box.
  dispose() {
    this.observer.disconnect();
    this.destroy();
  }
}

// Byte ticks in the one unit the largest needs (KiB to TiB): "300 MiB", not "2.9e-1 GiB".
export function byteTicks(splits, incr) {
  const top = Math.max(...splits.map((v) => Math.abs(v)));
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  const power = Math.min(Math.max(Math.floor(Math.log2(top || 1) / 10), 0), units.length - 1);
  const div = 2 ** (10 * power);
  // As many decimals as the spacing has (2.5 MiB apart: one), up to three.
  const step = incr / div;
  let digits = Math.max(0, -Math.floor(Math.log10(step || 1)));
  while (digits < 3 && Math.abs(step * 10 ** digits - Math.round(step * 10 ** digits)) > 1e-6) {
    digits += 1;
  }
  return splits.map((v) => (v === 0 ? "0" : `${(v / div).toFixed(digits)} ${units[power]}`));
}

// Axis labels with as many digits as the ticks' spacing needs, readable from a learning
// rate of 3e-4 to 50,000 tokens/s.
function tick(v, incr) {
  if (v === 0) return "0";
  const size = Math.abs(v);
  if (size >= 1e5 || size < 1e-3) {
    const digits = Math.ceil(Math.log10(size / (incr || size)));
    return v.toExponential(Math.min(Math.max(digits, 0), 4));
  }
  return v.toFixed(Math.min(Math.max(-Math.floor(Math.log10(incr || 1)), 0), 6));
}

function finite(v) {
  return typeof v === "number" && Number.isFinite(v);
}

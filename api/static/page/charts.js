// Line charts drawn as SVG by hand: nothing to load, nothing fetched.

const NS = "http://www.w3.org/2000/svg";
const W = 600, H = 200, PAD = { left: 48, right: 8, top: 8, bottom: 22 };

function svgEl(tag, attrs) {
  const node = document.createElementNS(NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  return node;
}

// series: [{ name, points: [[step, value], ...] }]; the first series sets data-points.
export function drawChart(svg, series) {
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.replaceChildren();
  const all = series.flatMap((s) => s.points).filter(([, y]) => Number.isFinite(y));
  svg.dataset.points = String(series[0]?.points.length ?? 0);
  if (all.length === 0) {
    svg.append(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }));
    svg.lastChild.textContent = "no data yet";
    return;
  }
  const xs = all.map(([x]) => x), ys = all.map(([, y]) => y);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (y0 === y1) { y0 -= 1; y1 += 1; }
  const sx = (x) => PAD.left + ((x - x0) / (x1 - x0 || 1)) * (W - PAD.left - PAD.right);
  const sy = (y) => H - PAD.bottom - ((y - y0) / (y1 - y0)) * (H - PAD.top - PAD.bottom);
  svg.append(
    svgEl("line", { class: "axis", x1: PAD.left, y1: H - PAD.bottom, x2: W - PAD.right, y2: H - PAD.bottom }),
    svgEl("line", { class: "axis", x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: H - PAD.bottom }),
  );
  const labels = [
    [PAD.left - 4, PAD.top + 10, "end", y1], [PAD.left - 4, H - PAD.bottom, "end", y0],
    [PAD.left, H - 6, "start", `step ${x0}`], [W - PAD.right, H - 6, "end", `step ${x1}`],
  ];
  for (const [x, y, anchor, text] of labels) {
    const label = svgEl("text", { x, y, "text-anchor": anchor });
    label.textContent = typeof text === "number" ? text.toPrecision(4) : text;
    svg.append(label);
  }
  series.forEach((s, i) => {
    const pts = s.points.filter(([, y]) => Number.isFinite(y));
    if (pts.length === 0) return;
    const line = svgEl("polyline", {
      class: i === 0 ? "line" : "line val",
      points: pts.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" "),
    });
    line.dataset.series = s.name;
    svg.append(line);
  });
}

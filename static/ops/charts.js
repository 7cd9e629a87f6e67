// The dashboard's charts, drawn on a <canvas> by our own code (no library, no CDN): a line chart of
// several series over a shared x axis, and a bar chart with one bar picked out.
"use strict";

const Charts = (() => {
  const PALETTE = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2"];
  const PAD = {left: 70, right: 12, top: 12, bottom: 28};

  function frame(canvas) {
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    ctx.font = "12px system-ui, sans-serif";
    return {ctx, w: canvas.width - PAD.left - PAD.right, h: canvas.height - PAD.top - PAD.bottom};
  }

  function axes(ctx, w, h, yMax, xLabel) {
    ctx.strokeStyle = "#9ca3af";
    ctx.fillStyle = "#374151";
    ctx.beginPath();
    ctx.moveTo(PAD.left, PAD.top);
    ctx.lineTo(PAD.left, PAD.top + h);
    ctx.lineTo(PAD.left + w, PAD.top + h);
    ctx.stroke();
    ctx.textAlign = "right";
    ctx.fillText(yMax.toExponential(1), PAD.left - 6, PAD.top + 10);
    ctx.fillText("0", PAD.left - 6, PAD.top + h);
    ctx.textAlign = "center";
    ctx.fillText(xLabel, PAD.left + w / 2, PAD.top + h + 22);
  }

  // series: [{name, points: [[x, y], ...]}]; an all-zero chart says so instead of an empty frame.
  function lines(canvas, series, xLabel) {
    const {ctx, w, h} = frame(canvas);
    const all = series.flatMap((s) => s.points);
    if (!all.length) {
      ctx.fillStyle = "#6b7280";
      ctx.fillText("no verified replays yet", PAD.left + 10, PAD.top + 20);
      return;
    }
    const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
    const xMin = Math.min(...xs), xMax = Math.max(...xs), yMax = Math.max(...ys) || 1e-9;
    const x = (v) => PAD.left + (xMax === xMin ? w / 2 : (v - xMin) / (xMax - xMin) * w);
    const y = (v) => PAD.top + h - v / yMax * h;
    axes(ctx, w, h, yMax, xLabel);
    ctx.textAlign = "left";
    ctx.fillText(String(xMin), PAD.left, PAD.top + h + 12);
    ctx.textAlign = "right";
    ctx.fillText(String(xMax), PAD.left + w, PAD.top + h + 12);
    series.forEach((s, i) => {
      const color = PALETTE[i % PALETTE.length];
      ctx.strokeStyle = ctx.fillStyle = color;
      ctx.beginPath();
      s.points.forEach(([px, py], j) => (j ? ctx.lineTo(x(px), y(py)) : ctx.moveTo(x(px), y(py))));
      ctx.stroke();
      s.points.forEach(([px, py]) => ctx.fillRect(x(px) - 1.5, y(py) - 1.5, 3, 3));
      ctx.textAlign = "left";
      ctx.fillText(s.name, PAD.left + 8, PAD.top + 14 + 14 * i);
    });
    if (!Math.max(...ys)) {
      ctx.fillStyle = "#059669";
      ctx.textAlign = "right";
      ctx.fillText("every replay matched its eager step exactly (|delta| = 0)", PAD.left + w, PAD.top + 14);
    }
  }

  // values: one bar each (labelled by index); `marked` is drawn in red; an infinite value fills the height.
  function bars(canvas, values, marked, xLabel) {
    const {ctx, w, h} = frame(canvas);
    if (!values.length) return;
    const yMax = Math.max(...values.filter(Number.isFinite)) || 1e-9, slot = w / values.length;
    values = values.map((v) => Math.min(v, yMax));
    axes(ctx, w, h, yMax, xLabel);
    values.forEach((v, i) => {
      ctx.fillStyle = i === marked ? "#dc2626" : "#2563eb";
      const bh = v / yMax * h;
      ctx.fillRect(PAD.left + i * slot + slot * 0.15, PAD.top + h - bh, slot * 0.7, bh);
      ctx.fillStyle = "#374151";
      ctx.textAlign = "center";
      ctx.fillText(String(i), PAD.left + i * slot + slot / 2, PAD.top + h + 12);
    });
  }

  return {lines, bars};
})();

// What happened to a run, as marks on its charts: each recovery (the step it failed near,
// shaded back to the step it restored), each pause (at the checkpoint it saved) and each
// committed checkpoint, read from the job's events.

export function marksFrom(events) {
  const marks = [];
  let lastCheckpoint = null;
  for (const event of events) {
    const data = event.data ?? {};
    if (data.kind === "checkpoint_committed") {
      lastCheckpoint = data.step;
      marks.push({ kind: "checkpoint", step: data.step, text: `checkpoint at step ${data.step}` });
    } else if (data.kind === "recovery") {
      const injected = data.injected ? ` (${data.injected})` : "";
      marks.push({
        kind: "restart",
        step: data.front_step,
        from: data.restored_step,
        text: `restart near step ${data.front_step}: ${data.cause || "a failure"}${injected}; ` +
          `rolled back to step ${data.restored_step}, MTTR ${Number(data.mttr_s).toFixed(1)} s`,
      });
    } else if (event.kind === "state" && data.to === "PAUSED" && lastCheckpoint !== null) {
      marks.push({ kind: "pause", step: lastCheckpoint, text: `paused at step ${lastCheckpoint}` });
    }
  }
  return marks;
}

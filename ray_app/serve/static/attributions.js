// The attributions on the page of `kermt serve` (loaded before page.js, whose helpers it uses when called): the
// legend of the coloured drawings, their hover text, each entry's note. Text goes in through textContent.
"use strict";

// "t1 0.4262 = baseline 0.4196 + atoms -0.09417 + descriptors 0.09914; largest atom 0.424 (atom 6)"
function attributionTitle(p, task) {
  const atoms = p[task + "_atoms"];
  const sum = atoms.reduce((a, b) => a + b, 0);
  let largest = 0;
  atoms.forEach((v, i) => { if (Math.abs(v) > Math.abs(atoms[largest])) largest = i; });
  let text = task + " " + formatNumber(p[task]) + " = baseline " + formatNumber(p[task + "_baseline"])
    + " + atoms " + formatNumber(sum);
  if (isSet(p[task + "_descriptors"])) text += " + descriptors " + formatNumber(p[task + "_descriptors"]);
  return text + "; largest atom " + formatNumber(atoms[largest]) + " (atom " + (largest + 1) + ")";
}

// The legend of the coloured drawings: which task they show and what the colours mean (a classifier's shares
// explain its logit, so red raises the probability too).
function showLegend(result) {
  const box = $("legend-box");
  const attributed = result.predictions.some((p) => p.attribution_svg);
  box.hidden = !attributed;
  if (!attributed) return;
  const model = state.models.find((m) => m.name === result.model) || {tasks: [], dataset_type: ""};
  const select = $("attribution-task");
  if (select.dataset.model !== result.model) {
    select.replaceChildren(...model.tasks.map((task) => {
      const option = document.createElement("option");
      option.value = option.textContent = task;
      return option;
    }));
    select.dataset.model = result.model;
  }
  const task = select.value;
  const what = model.dataset_type === "classification" ? "the logit (and so the probability) of " + task
    : "the predicted " + task;
  $("legend-raises").textContent = "red: the atom raises " + what;
  $("legend-lowers").textContent = "blue: it lowers it";
  $("legend-text").textContent = "Compared with an average drug-like atom in its place: " + task + " = its "
    + "baseline + the atoms' shares (+ the descriptors' share). The deeper the colour, the larger the atom's "
    + "share, relative to the molecule's largest; white atoms hardly count. Drawn as the model saw the molecule "
    + "(standardised where it standardises). Hover a drawing for its numbers.";
}

function attributionTask() {
  return $("legend-box").hidden ? null : $("attribution-task").value;
}

function statusText(p) {
  if (!p.valid) return p.error;
  return p.attributions_note ? "ok; " + p.attributions_note : "ok";
}

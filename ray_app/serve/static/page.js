// The page of `kermt serve`: reads SMILES (typed or from a CSV), calls the JSON API of this server, shows the
// table and builds the CSV download in the browser. Every text from a request or response goes into the page
// through textContent (never innerHTML); molecule drawings are sanitised SVG shown through <img> data URLs.
"use strict";

const ROOT = document.querySelector('meta[name="kermt-root"]').content;
const SHOWN_DIGITS = 4;  // significant digits in the table; the CSV keeps the full values
const state = {models: [], auth: false, results: null, downloadUrl: null};
// the per-task columns of a result, in the order of each task's group: the table shows all but the atom lists,
// which the CSV keeps (as kermt predict --attributions writes them)
const TASK_SUFFIXES = ["", "_std", "_lower", "_upper", "_calibrated", "_set", "_atoms", "_baseline", "_descriptors"];
const CSV_ONLY_SUFFIXES = ["_atoms"];

const $ = (id) => document.getElementById(id);

function showMessage(text, isError) {
  const message = $("message");
  message.textContent = text;
  message.className = isError ? "error" : "";
}

function headers() {
  const out = {"content-type": "application/json"};
  const key = $("api-key-input").value.trim();
  if (key) out.authorization = "Bearer " + key;
  return out;
}

async function errorText(response) {
  let detail = response.statusText;
  try {
    const body = await response.json();
    detail = typeof body.detail === "string" ? body.detail
      : (body.detail || []).map((e) => (e.loc || []).join(".") + ": " + e.msg).join("; ");
  } catch (_) { /* not JSON: keep the status text */ }
  if (response.status === 401) return "The server needs an API key: enter it above (" + detail + ")";
  return "HTTP " + response.status + ": " + detail;
}

function selectedModel() {
  return state.models.find((m) => m.name === $("model-select").value) || state.models[0];
}

function showModelOptions() {
  const model = selectedModel();
  if (!model) return;
  $("uncertainty-box").hidden = model.members.length < 2;
  $("interval-box").hidden = !model.calibrated;
  // a calibrated classifier answers a level with prediction sets, a regression with intervals
  $("interval-label").textContent = model.dataset_type === "regression" ? "interval" : "prediction set";
  $("domain-box").hidden = !model.domain;
  showAbout(model);
}

// "About this model": what GET /models says about the selected model and, when its run recorded one, how it scored
// on its test molecules. Each value is a [key, label, text, title]; the text goes in through textContent.
const NO_TRAINING = "no training record (a single checkpoint, or a run directory without run.json)";

const isSet = (value) => value !== null && value !== undefined;

function pairs(entries, format) {  // {t1: 0.3, t2: null} -> "t1 0.3, t2 n/a"
  return Object.entries(entries).map(([key, value]) => key + " " + (isSet(value) ? format(value) : "n/a")).join(", ");
}

function testScore(training) {
  if (!isSet(training.overall_test_score)) return "not recorded";
  let text = (training.metric || "score") + " " + formatNumber(training.overall_test_score);
  if (isSet(training.overall_test_std)) text += " \u00b1 " + formatNumber(training.overall_test_std);
  const folds = (training.fold_test_scores || []).length;
  return folds ? text + " over " + folds + " fold" + (folds > 1 ? "s" : "") : text;
}

function calibrationText(model) {
  const training = model.training || {};
  const method = training.calibration_method || model.calibration_method;
  if (!method) return "none";
  if (training.calibration_size) {
    return method + ", fitted on " + training.calibration_source + ": " + pairs(training.calibration_size, String);
  }
  const size = isSet(model.calibration_size) ? ", fitted on " + model.calibration_size + " molecules per task" : "";
  return method + size;
}

function trainingRows(training) {
  if (!training) return [["training", "Training record", NO_TRAINING]];
  const metric = training.metric || "score";
  return [
    ["test_score", "Test score (ensemble, over folds)", testScore(training)],
    ["task_test_scores", "Test " + metric + " per task (members' mean)",
     training.task_test_scores ? pairs(training.task_test_scores, formatNumber) : "not recorded"],
    ["split", "Split", training.split || training.split_type || "not recorded"],
    ["run_id", "Run", training.run_id || "not recorded"],
  ];
}

function aboutRows(model) {
  const features = model.features_generator.length
    ? model.features_generator.join(", ") + (model.features_scaling ? ", scaled" : ", not scaled") : "none";
  return [
    ["dataset_type", "Dataset type", model.dataset_type],
    ["tasks", "Tasks", model.tasks.join(", ")],
    ["members", "Members", String(model.members.length)],
    ["features", "Molecule features", features],
    ...trainingRows(model.training),
    ["calibration", "Calibration", calibrationText(model)],
    ["domain", "Applicability domain", model.domain ? "yes" : "no", model.domain_missing || ""],
  ];
}

function showAbout(model) {
  $("about-title").textContent = "About this model: " + model.name;
  $("about-list").replaceChildren(...aboutRows(model).flatMap(([key, label, text, title]) => {
    const term = document.createElement("dt");
    term.textContent = label;
    const value = document.createElement("dd");
    value.textContent = text;
    value.dataset.key = key;
    if (title) value.title = title;
    return [term, value];
  }));
  $("about-box").hidden = false;
}

async function loadModels() {
  const response = await fetch(ROOT + "/models", {headers: headers()});
  if (!response.ok) {
    $("served").textContent = "";
    showMessage(await errorText(response), true);
    return;
  }
  state.models = (await response.json()).models;
  const select = $("model-select");
  select.replaceChildren(...state.models.map((m) => {
    const option = document.createElement("option");
    option.value = m.name;
    option.textContent = m.name + " (" + m.dataset_type + ": " + m.tasks.join(", ") + ")";
    option.selected = m.default;
    return option;
  }));
  $("model-box").hidden = state.models.length < 2;
  $("served").textContent = "Serving " + state.models.map((m) => m.name + " (" + m.tasks.join(", ") + ", "
    + m.members.length + " member" + (m.members.length > 1 ? "s" : "") + ")").join("; ");
  showMessage("", false);
  showModelOptions();
}

// One molecule per non-empty line: the SMILES, then optionally whitespace and a name (which may hold spaces).
function parseLines(text) {
  return text.split(/\r?\n/).map((line) => line.trim()).filter((line) => line).map((line) => {
    const match = line.match(/^(\S+)(?:\s+(.*))?$/);
    return {smiles: match[1], name: match[2] || ""};
  });
}

// RFC 4180 CSV: quoted fields may hold commas, quotes ("") and line breaks.
function parseCsv(text) {
  const rows = [];
  let row = [], field = "", quoted = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') { field += '"'; i++; }
      else if (c === '"') quoted = false;
      else field += c;
    } else if (c === '"') quoted = true;
    else if (c === ",") { row.push(field); field = ""; }
    else if (c === "\n" || c === "\r") {
      if (c === "\r" && text[i + 1] === "\n") i++;
      row.push(field); rows.push(row); row = []; field = "";
    } else field += c;
  }
  if (field || row.length) { row.push(field); rows.push(row); }
  return rows.filter((r) => r.some((f) => f.trim()));
}

function readCsvFile(file) {
  const reader = new FileReader();
  reader.onload = () => {
    const rows = parseCsv(String(reader.result).replace(/^\uFEFF/, ""));
    const header = (rows[0] || []).map((h) => h.trim().toLowerCase());
    const smilesAt = header.indexOf("smiles"), nameAt = header.indexOf("name");
    if (smilesAt < 0) {
      showMessage(file.name + ": no 'smiles' column in the header row (" + header.join(", ") + ")", true);
      return;
    }
    const lines = rows.slice(1).map((r) => ((r[smilesAt] || "").trim() + " " + (nameAt >= 0 ? r[nameAt] || "" : ""))
      .trim()).filter((line) => line);
    $("smiles-input").value = lines.join("\n");
    showMessage("Read " + lines.length + " molecule(s) from " + file.name + "; press Predict", false);
  };
  reader.onerror = () => showMessage(file.name + ": could not be read", true);
  reader.readAsText(file);
}

// The columns of the result: each task, its _std, its interval (a regression) or its calibrated probability and
// prediction set (a classifier), its attributions (with the atom lists only when ``withAtoms``: the CSV), then the
// applicability domain.
function valueColumns(model, predictions, withAtoms) {
  const keys = new Set(predictions.flatMap((p) => Object.keys(p)));
  const columns = [];
  for (const task of model.tasks) {
    for (const suffix of TASK_SUFFIXES) {
      if (keys.has(task + suffix) && (withAtoms || !CSV_ONLY_SUFFIXES.includes(suffix))) columns.push(task + suffix);
    }
  }
  for (const column of ["domain_distance", "in_domain"]) {
    if (keys.has(column)) columns.push(column);
  }
  return columns;
}

function formatNumber(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "boolean") return value ? "yes" : "no";  // in_domain
  if (typeof value === "string") return value;  // <task>_set: "0", "1", "0,1" or ""
  return String(Number(value.toPrecision(SHOWN_DIGITS)));
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

// The drawing of a molecule: coloured by its attributions for the task the legend picks, when it has them.
function moleculeCell(row, prediction, task) {
  const td = cell(row, "", "molecule");
  const coloured = task && prediction.attribution_svg ? prediction.attribution_svg[task] : null;
  const svg = coloured || prediction.svg;
  if (!svg) { td.textContent = "\u2014"; return; }
  const img = document.createElement("img");
  img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svg);
  img.alt = prediction.smiles;
  img.dataset.coloured = coloured ? task : "";
  if (coloured) img.title = attributionTitle(prediction, task);
  td.appendChild(img);
}

function renderTable(result) {
  const {molecules, predictions, columns} = result;
  const withNames = molecules.some((m) => m.name);
  const head = document.createElement("tr");
  for (const title of ["#", ...(withNames ? ["name"] : []), "molecule", "SMILES", ...columns, "status"]) {
    const th = document.createElement("th");
    th.textContent = title;
    head.appendChild(th);
  }
  $("results-table").tHead.replaceChildren(head);
  showLegend(result);
  const task = attributionTask();
  const rows = predictions.map((p, i) => {
    const row = document.createElement("tr");
    row.className = p.valid ? "valid" : "invalid";
    row.dataset.index = String(i);
    cell(row, String(i + 1));
    if (withNames) cell(row, molecules[i].name, "name");
    moleculeCell(row, p, task);
    cell(row, p.smiles, "smiles");
    for (const column of columns) {
      const td = cell(row, formatNumber(p[column]), "number");
      td.dataset.column = column;
      td.title = p[column] === null ? "" : String(p[column]);
    }
    cell(row, statusText(p), "status" + (p.valid ? "" : " invalid"));
    return row;
  });
  $("results-table").tBodies[0].replaceChildren(...rows);
  const invalid = predictions.filter((p) => !p.valid).length;
  $("summary").textContent = "Model " + result.model + ": " + predictions.length + " molecule(s), "
    + invalid + " invalid";
  $("results").hidden = false;
}

async function predict(event) {
  event.preventDefault();
  const molecules = parseLines($("smiles-input").value);
  if (!molecules.length) { showMessage("Enter at least one SMILES", true); return; }
  if (!state.models.length) {  // not listed yet (an API key typed just now): list them first
    await loadModels();
    if (!state.models.length) return;
  }
  const model = selectedModel();
  const body = {smiles: molecules.map((m) => m.smiles), depict: true};
  if (model && !$("uncertainty-box").hidden && $("uncertainty-input").checked) body.uncertainty = true;
  if (model && !$("interval-box").hidden && $("interval-enabled").checked) {
    body.interval = Number($("interval-input").value);
  }
  if (model && !$("domain-box").hidden && $("domain-input").checked) body.domain = true;
  if ($("attributions-input").checked) body.attributions = true;
  const path = model && !model.default ? "/models/" + encodeURIComponent(model.name) + "/predict" : "/predict";
  $("submit-button").disabled = true;
  showMessage("Predicting " + molecules.length + " molecule(s)\u2026", false);
  try {
    const response = await fetch(ROOT + path, {method: "POST", headers: headers(), body: JSON.stringify(body)});
    if (!response.ok) { showMessage(await errorText(response), true); return; }
    const answer = await response.json();
    const served = state.models.find((m) => m.name === answer.model) || {tasks: []};
    state.results = {model: answer.model, molecules, predictions: answer.predictions,
                     columns: valueColumns(served, answer.predictions, false),
                     csvColumns: valueColumns(served, answer.predictions, true)};
    renderTable(state.results);
    showMessage("", false);
  } catch (error) {
    showMessage("The server did not answer: " + error, true);
  } finally {
    $("submit-button").disabled = false;
  }
}

// A CSV field: quoted when it holds a comma, quote or line break; text that a spreadsheet would run as a formula
// (=, +, @) gets a leading apostrophe.
function csvField(value) {
  if (value === null || value === undefined) return "";
  let text = Array.isArray(value) ? JSON.stringify(value) : String(value);  // <task>_atoms: a JSON list
  if (typeof value === "string" && /^[=+@\t\r]/.test(text)) text = "'" + text;
  return /[",\r\n]/.test(text) ? '"' + text.replace(/"/g, '""') + '"' : text;
}

function resultCsv(result) {
  const withNames = result.molecules.some((m) => m.name);
  const header = [...(withNames ? ["name"] : []), "smiles", ...result.csvColumns, "valid", "error"];
  const lines = [header.map(csvField).join(",")];
  result.predictions.forEach((p, i) => {
    const values = [...(withNames ? [result.molecules[i].name] : []), p.smiles,
                    ...result.csvColumns.map((c) => p[c]), p.valid, p.error];
    lines.push(values.map(csvField).join(","));
  });
  return lines.join("\r\n") + "\r\n";
}

function download() {
  if (!state.results) return;
  if (state.downloadUrl) URL.revokeObjectURL(state.downloadUrl);
  state.downloadUrl = URL.createObjectURL(new Blob([resultCsv(state.results)], {type: "text/csv"}));
  const link = $("download-link");
  link.href = state.downloadUrl;
  link.click();
}

async function start() {
  $("predict-form").addEventListener("submit", predict);
  $("download-button").addEventListener("click", download);
  $("model-select").addEventListener("change", showModelOptions);
  $("attribution-task").addEventListener("change", () => { if (state.results) renderTable(state.results); });
  $("api-key-input").addEventListener("change", loadModels);
  $("csv-input").addEventListener("change", (e) => { if (e.target.files[0]) readCsvFile(e.target.files[0]); });
  try {
    const health = await (await fetch(ROOT + "/healthz")).json();
    state.auth = health.auth;
    $("auth-box").hidden = !health.auth;
    if (health.auth && !$("api-key-input").value) {
      $("served").textContent = "This server needs an API key: enter it to see its models.";
      return;
    }
    await loadModels();
  } catch (error) {
    showMessage("The server did not answer: " + error, true);
  }
}

document.addEventListener("DOMContentLoaded", start);

// The Airflow UI of `make airflow`, driven as a person would (make test-ui; not in make test).
//
//   make test-ui      # installs Debian's chromium and playwright-core (npm ci) when missing
//
// Starts scripts/airflow.sh on a free loopback port with a throwaway AIRFLOW_HOME, then in
// headless Chromium (Debian's /usr/bin/chromium, never a downloaded browser): signs in, opens
// dressage_mopd and its docs, fills the trigger form, sees the form refuse a bad value with its
// message, sees a run with steps 0 fail at once with one sentence in its note, triggers a
// one-step run, waits for it, and opens its graph, its note (summary and curves), the curves
// themselves and the end of the train task's log. Screenshots go to tests/ui/artifacts/
// (gitignored; UI_ARTIFACTS moves them). UI_BASE_URL and UI_AIRFLOW_HOME reuse a running
// instance instead of starting one; UI_QUICK=1 skips the one-step run, and UI_RUN_ID reads a
// finished one instead of triggering it.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";

import { chromium } from "playwright-core";

const REPO = path.resolve(import.meta.dirname, "..", "..");
const OUT = process.env.UI_ARTIFACTS ?? path.join(import.meta.dirname, "artifacts");
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const DAG = "dressage_mopd";
const work = fs.mkdtempSync(path.join(os.tmpdir(), "dressage-ui-"));

let base = process.env.UI_BASE_URL;
let home = process.env.UI_AIRFLOW_HOME;
let airflow;
let browser;
let page;
let token;
let runId = process.env.UI_RUN_ID; // a finished one-step run to read instead of a new one
const QUICK = process.env.UI_QUICK === "1"; // skip the one-step run (1.5 to 5 minutes)

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
    server.on("error", reject);
  });
}

async function until(what, seconds, probe) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    try {
      const value = await probe();
      if (value) return value;
    } catch {
      // not yet
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${seconds} s: ${what}`);
    await sleep(2000);
  }
}

async function api(method, route, body) {
  const response = await fetch(`${base}/api/v2${route}`, {
    method,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: response.status, json: await response.json() };
}

async function shot(name) {
  await page.screenshot({ path: path.join(OUT, `${name}.png`) });
}

async function startAirflow() {
  const port = await freePort();
  home = path.join(work, "airflow_home");
  base = `http://127.0.0.1:${port}`;
  const env = Object.fromEntries(
    Object.entries(process.env).filter(([k]) => !/^(AIRFLOW|DRESSAGE_JOB)/.test(k)),
  );
  const log = fs.openSync(path.join(OUT, "airflow.log"), "w");
  airflow = spawn("bash", ["scripts/airflow.sh"], {
    cwd: REPO,
    env: { ...env, DRESSAGE_AIRFLOW_HOME: home, AIRFLOW_PORT: String(port) },
    stdio: ["ignore", log, log],
    detached: true, // its own process group: the script stops Airflow's with it
  });
  await until("Airflow healthy", 300, async () => {
    const health = await (await fetch(`${base}/api/v2/monitor/health`)).json();
    return ["metadatabase", "scheduler", "triggerer", "dag_processor"].every(
      (part) => health[part]?.status === "healthy",
    );
  });
}

function password() {
  const file = path.join(home, "simple_auth_manager_passwords.json.generated");
  return JSON.parse(fs.readFileSync(file, "utf8")).admin;
}

async function latestRun() {
  const { json } = await api("GET", `/dags/${DAG}/dagRuns?order_by=-run_after&limit=1`);
  return json.dag_runs[0];
}

async function waitRun(runId, seconds) {
  return until(`${runId} finished`, seconds, async () => {
    const { json } = await api("GET", `/dags/${DAG}/dagRuns/${encodeURIComponent(runId)}`);
    return ["success", "failed"].includes(json.state) ? json.state : null;
  });
}

async function openTriggerForm() {
  await page.goto(`${base}/dags/${DAG}`);
  await page.getByRole("button", { name: /^Trigger/ }).first().click();
  await page.getByText("Run Parameters").waitFor();
}

async function setNumber(name, value) {
  const input = page.locator(`[id="number-input:${name}"] input`);
  await input.fill(String(value));
  await input.press("Tab");
}

async function setText(name, value) {
  await page.locator(`#element_${name}`).fill(value);
}

async function setJson(name, text) {
  const editor = page.locator(`#element_${name}`);
  await editor.click();
  await page.keyboard.press("ControlOrMeta+A");
  await page.keyboard.press("Delete");
  await page.keyboard.insertText(text);
}

async function fillRun({ steps, extra }) {
  await setText("artifact_root", path.join(work, "artifacts"));
  await setNumber("element_steps", steps);
  await page.getByText("Job and cluster settings").click();
  await setText("run_root", path.join(work, "runs"));
  await setNumber("element_rollout_batch_size", 2);
  await setJson("extra", extra);
  const typed = await page.locator("#element_extra .view-lines").innerText();
  assert.deepEqual(JSON.parse(typed.replace(/\u00a0/g, " ")), JSON.parse(extra));
}

async function trigger() {
  const before = (await latestRun())?.dag_run_id;
  const button = page.getByRole("dialog").getByRole("button", { name: /^Trigger$/ });
  await button.click();
  return until("the new run", 60, async () => {
    const run = await latestRun();
    return run && run.dag_run_id !== before ? run.dag_run_id : null;
  });
}

before(async () => {
  fs.mkdirSync(OUT, { recursive: true });
  if (!base) await startAirflow();
  const tokenResponse = await fetch(`${base}/auth/token`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ username: "admin", password: password() }),
  });
  token = (await tokenResponse.json()).access_token;
  await until("the DAG parsed", 180, async () => (await api("GET", `/dags/${DAG}`)).status === 200);
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] });
  page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  page.setDefaultTimeout(30000);
});

after(async () => {
  await browser?.close();
  if (airflow) {
    try {
      process.kill(-airflow.pid, "SIGTERM");
    } catch {
      // already gone
    }
    await until("Airflow stopped", 60, async () => airflow.exitCode !== null).catch(() => {});
  }
});

test("a person signs in, triggers dressage_mopd and reads what the run tells", async (t) => {
  await t.test("sign in", async () => {
    await page.goto(base);
    await page.fill('input[name="username"]', "admin");
    await page.fill('input[name="password"]', password());
    await page.click('button[type="submit"]');
    await page.waitForURL((url) => !url.pathname.startsWith("/auth"));
  });

  await t.test("the DAG page and its docs", async () => {
    await page.goto(`${base}/dags/${DAG}`);
    await page.getByText("plan", { exact: true }).first().waitFor();
    await shot("01-dag-page");
    await page.getByRole("button", { name: /Dag Docs/ }).click();
    const docs = page.getByRole("dialog");
    await docs.getByText("checks the form's values").waitFor();
    await page.waitForTimeout(1000); // the dialog's fade-in, for a readable screenshot
    await shot("02-dag-docs");
    await page.keyboard.press("Escape");
  });

  await t.test("the form: plain descriptions, ranges, optional fields, a bad value refused", async () => {
    await openTriggerForm();
    const form = page.getByRole("dialog");
    await form.getByText("A whole number from 1 to 1,000,000.").waitFor();
    assert.equal(await form.getByText("`").count(), 0); // no markdown backticks shown
    await shot("03-trigger-form");
    await page.getByText("Job and cluster settings").click();
    await page.locator(`#element_ray_address`).scrollIntoViewIfNeeded();
    await shot("04-job-and-cluster-settings");
    await setJson("extra", '{"max_response_len": 16,');
    const refused = form.getByText(/JSON/);
    await refused.first().waitFor();
    await refused.first().scrollIntoViewIfNeeded();
    const triggerButton = form.getByRole("button", { name: /^Trigger$/ });
    assert.equal(await triggerButton.isDisabled(), true);
    await shot("05-form-refuses-bad-json");
    await page.keyboard.press("Escape");
  });

  await t.test("steps 0 passes the form and fails the run at once, in one sentence", async () => {
    await openTriggerForm();
    await fillRun({ steps: 0, extra: '{"max_response_len": 16, "agent_max_turns": 1}' });
    const runId = await trigger();
    assert.equal(await waitRun(runId, 180), "failed");
    await page.goto(`${base}/dags/${DAG}/runs/${encodeURIComponent(runId)}`);
    const sentence = "Training steps (steps) is 0: enter a whole number from 1 to 1,000,000.";
    await page.getByText(sentence).first().waitFor();
    await shot("06-run-refused-steps-0");
  });

  await t.test("a one-step run succeeds", { skip: QUICK || Boolean(runId) }, async () => {
    await openTriggerForm();
    await fillRun({ steps: 1, extra: '{"max_response_len": 16, "agent_max_turns": 1}' });
    await shot("07-trigger-one-step");
    runId = await trigger();
    assert.equal(await waitRun(runId, 900), "success");
  });

  await t.test("the graph, the note with the summary, the curves, the train log", { skip: QUICK }, async () => {
    const runPage = `${base}/dags/${DAG}/runs/${encodeURIComponent(runId)}`;
    await page.goto(runPage);
    await page.getByText("MOPD, 1 step(s), 2 teacher(s)").first().waitFor();
    // the headline: held-out accuracy per task, measured through the agent loop
    await page.getByText(/held-out accuracy calculator \d+% → \d+%, lookup \d+% → \d+%/).first().waitFor();
    await shot("08-run-page-note-headline");
    await page.getByRole("button", { name: "Edit note" }).click();
    const note = page.getByRole("dialog");
    await note.getByRole("cell", { name: "calculator" }).first().waitFor(); // teacher and task tables
    const image = note.getByRole("img", { name: "curves" });
    await image.waitFor();
    await until("the curves image loaded", 30, () => image.evaluate((img) => img.naturalWidth > 0));
    await shot("09-run-note-summary-and-curves");
    await page.keyboard.press("Escape");

    await page.getByRole("button", { name: /Show Graph/ }).first().click();
    await page.locator(".react-flow__edge").first().waitFor();
    // as many edges as the DAG itself has, read from Airflow rather than written down here
    const { json: dagTasks } = await api("GET", `/dags/${DAG}/tasks`);
    const edges = dagTasks.tasks.reduce((n, task) => n + task.downstream_task_ids.length, 0);
    assert.ok(edges > 0);
    await until(`${edges} edges drawn`, 30, async () => (await page.locator(".react-flow__edge").count()) === edges);
    assert.equal(await page.locator(".react-flow__edge").count(), edges);
    await shot("10-graph");

    const curves = await page.request.get(
      `${base}/dressage/curves?dag_id=${DAG}&run_id=${encodeURIComponent(runId)}`,
    );
    assert.equal(curves.status(), 200);
    assert.equal(curves.headers()["content-type"], "image/png");
    await page.goto(runPage);
    await page.getByRole("button", { name: "Edit note" }).click();
    const link = page.getByRole("dialog").getByRole("link", { name: "open the curves" });
    const [tab] = await Promise.all([page.context().waitForEvent("page"), link.click()]);
    await tab.waitForLoadState();
    assert.match(tab.url(), /\/dressage\/curves\?dag_id=dressage_mopd&run_id=/);
    await tab.screenshot({ path: path.join(OUT, "11-curves.png") });
    await tab.close();

    await page.goto(`${runPage}/tasks/train`);
    await page.getByText("run summary").first().waitFor({ timeout: 60000 });
    await page.keyboard.press("f"); // the log viewer's fullscreen
    await page.getByText("held-out reverse KL (before -> after)").first().waitFor();
    await page.getByText("teacher accuracy  held-out accuracy (before -> after)").first().waitFor();
    await shot("12-train-log-summary");
  });
});

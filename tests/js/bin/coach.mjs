// Drives the Coach UI in headless Debian Chromium (playwright-core, no downloaded browser):
// load it, show a recipe's errors inline, launch a tiny run, watch the live chart grow, verify
// the sealed run's receipt, check the log's hash chain; a screenshot at each stop.
//
//   node bin/coach.mjs URL TOKEN OUT_DIR
//
// Prints one JSON line with what it saw; exits 1 (with the reason) when a step fails or the
// page logged an error (a CSP violation included).
import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const [url, token, out] = process.argv.slice(2);
if (!url || !token || !out) {
  console.error("usage: node bin/coach.mjs URL TOKEN OUT_DIR");
  process.exit(2);
}
mkdirSync(out, { recursive: true });

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const pageErrors = [];
const seen = {};
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  page.on("pageerror", (e) => pageErrors.push(`pageerror: ${e.message}`));
  page.on("console", (m) => { if (m.type() === "error") pageErrors.push(`console: ${m.text()}`); });
  const shot = (name) => page.screenshot({ path: join(out, `${name}.png`), fullPage: true });

  // Load: / redirects to the UI, which reports the node ready.
  await page.goto(url);
  await page.waitForSelector("#health.up");
  seen.loaded = page.url();
  await page.fill("#token", token);
  await page.click("#token-form button");

  // A broken recipe: its error is shown on its line.
  await page.goto(`${url}/ui/#/recipes/tiny_cpu_lora.yaml`);
  await page.waitForSelector("#recipe-status .pass");
  const yaml = await page.inputValue("#recipe-yaml");
  await page.fill("#recipe-yaml", yaml.replace("    r: 8\n", "    r: 0\n"));
  await page.click("#validate-button");
  const error = await page.waitForSelector(".recipe-error");
  seen.recipe_error = await error.textContent();
  seen.error_line = await page.locator(".err-line .ln").first().textContent();
  await shot("recipes");

  // Launch a tiny run and watch the chart fill in from server-sent events.
  await page.goto(`${url}/ui/#/runs`);
  await page.selectOption("#launch-recipe", "tiny_cpu_pretrain.yaml");
  await page.click("#launch-embedded");
  await page.waitForURL(/#\/run\//);
  seen.run = page.url();
  await page.waitForFunction(() => Number(document.querySelector("#chart-loss")?.dataset.points) >= 3
    && document.querySelector("#run-stats")?.dataset.phase !== "planning", null, { timeout: 300_000 });
  seen.points_while_training = Number(await page.getAttribute("#chart-loss", "data-points"));
  seen.phase_while_training = await page.getAttribute("#run-stats", "data-phase");
  await shot("run-live");

  // Sealed: the receipt verifies, each check listed.
  await page.waitForSelector('#run-stats[data-phase="finished"]', { timeout: 600_000 });
  await page.waitForSelector("#run-plan table");
  await page.click("#verify-receipt", { timeout: 60_000 });
  await page.waitForSelector("#receipt-outcome", { timeout: 60_000 });
  seen.receipt_outcome = (await page.textContent("#receipt-outcome")).trim();
  seen.checks = await page.$$eval("#receipt-checks tbody tr", (rows) =>
    rows.map((r) => ({ name: r.cells[0].textContent, status: r.cells[1].textContent })));
  seen.points = Number(await page.getAttribute("#chart-loss", "data-points"));
  seen.checkpoints = await page.$$eval("#run-checkpoints tbody tr", (rows) => rows.length);
  await shot("run-sealed");

  // The event log: hash chain intact, the run's events live in it.
  await page.goto(`${url}/ui/#/log`);
  await page.waitForSelector("#chain-status .intact");
  seen.chain = (await page.textContent("#chain-status")).trim();
  await shot("log");
  for (const name of ["anchors", "market"]) {
    await page.goto(`${url}/ui/#/${name}`);
    await page.waitForSelector("main section");
    await shot(name);
  }
  seen.errors = pageErrors;
  console.log(JSON.stringify(seen));
  process.exitCode = pageErrors.length ? 1 : 0;
  if (pageErrors.length) console.error(pageErrors.join("\n"));
} catch (e) {
  console.log(JSON.stringify({ ...seen, failed: String(e), errors: pageErrors }));
  console.error(e);
  process.exitCode = 1;
} finally {
  await browser.close();
}

// Opens a profile in speedscope, in a headless Chromium driven by
// puppeteer-core over a pipe (no port), and writes what speedscope loaded
// as speedscope itself exports it (its own file format, every thread with
// its calls as open and close events), so that a test can check it.
//
// node speedscope.js NPM_DIR CHROMIUM PROFILE OUT
//
// NPM_DIR holds node_modules/speedscope and node_modules/puppeteer-core
// (scripts/setup.sh installs them). Exits 1 with a message on stderr when
// speedscope refuses the file, reports an error, or has not loaded it
// within 60 seconds.
"use strict";
const path = require("path");
const fs = require("fs");

const [npmDir, chromium, profile, out] = process.argv.slice(2);
if (!out) {
  console.error("usage: node speedscope.js NPM_DIR CHROMIUM PROFILE OUT");
  process.exit(2);
}
const puppeteer = require(path.join(npmDir, "node_modules", "puppeteer-core"));
const index = path.join(npmDir, "node_modules", "speedscope", "dist", "release", "index.html");
// The whole load, from the browser's start to speedscope's export.
const deadline = Date.now() + 60_000;
const left = () => Math.max(1, deadline - Date.now());

async function main() {
  const browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    pipe: true,
    // Containers run as root without user namespaces.
    args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage", "--disable-crash-reporter"],
    timeout: left(),
  });
  try {
    return await load(browser);
  } finally {
    await browser.close();
  }
}

async function load(browser) {
  const page = await browser.newPage();
  const problems = [];
  // Rejected at the first sign that speedscope will not load the file.
  let refuse;
  const refused = new Promise((_, reject) => (refuse = reject));
  refused.catch(() => {});
  const problem = (text, fatal) => {
    problems.push(text);
    if (fatal) refuse(new Error(problems.join("\n")));
  };
  page.on("pageerror", (e) => problem(`page error: ${e.message}`, true));
  page.on("console", (m) => {
    if (m.text().startsWith("Failed to load")) problem(`console: ${m.text()}`, true);
    else if (m.type() === "error") problem(`console: ${m.text()}`, false);
  });
  page.on("dialog", async (d) => {
    problem(`alert: ${d.message()}`, true);
    await d.dismiss();
  });
  // speedscope exports through a Blob URL: keep the Blob.
  await page.evaluateOnNewDocument(() => {
    const create = URL.createObjectURL;
    URL.createObjectURL = (blob) => {
      window.__exported = blob;
      return create(blob);
    };
  });
  await page.goto(`file://${index}`, { waitUntil: "load", timeout: left() });
  const input = await page.waitForSelector("input#file", { timeout: left() });
  await input.uploadFile(profile);
  // Loaded: the landing page (and its file input) is gone and a profile
  // shows; failed: an alert, an error on the console, or speedscope's error page.
  const shown = page.waitForFunction(
    () => !document.querySelector("input#file") && !/Loading/.test(document.body.innerText),
    { timeout: left(), polling: 50 },
  );
  shown.catch(() => {});
  await Promise.race([shown, refused]).catch((e) => {
    throw new Error(`the profile did not show: ${e.message}`);
  });
  if (problems.length) throw new Error(problems.join("\n"));
  if (/Something went wrong/.test(await page.evaluate(() => document.body.innerText))) {
    throw new Error(`speedscope could not load ${profile}`);
  }
  // Ctrl+S: speedscope's export of what it loaded. Its key handler may be
  // attached a moment after the profile shows (on a busy machine, long
  // after): pressed again each second until the export comes.
  for (;;) {
    await page.keyboard.down("Control");
    await page.keyboard.press("s");
    await page.keyboard.up("Control");
    const exported = page.waitForFunction(() => window.__exported !== undefined, { timeout: Math.min(1000, left()), polling: 50 });
    exported.catch(() => {});
    try {
      await Promise.race([exported, refused]);
      break;
    } catch (e) {
      if (problems.length || left() <= 1) throw new Error(`the profile showed, its export did not come: ${e.message}`);
    }
  }
  const text = await page.evaluate(() => window.__exported.text());
  if (problems.length) throw new Error(problems.join("\n"));
  fs.writeFileSync(out, text);
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(`speedscope: ${e.message}`);
    process.exit(1);
  },
);

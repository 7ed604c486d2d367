package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/flowrun/flow/client"
)

// The web UI (issue 16) in a real headless Chromium: one flowd serving /ui/ on its --http
// port, pages opened and clicked through as a person would, and the screenshots of
// docs/ui.md. The handlers' own tests (status codes, escaping, authz) are in
// internal/app/webui; this test shows that the pages work together in a browser: links,
// anchors, <details>, forms with their CSRF tokens, the live stream and the sign-in.

// uiStep bounds one browser action (a navigation, a click, a wait for a condition):
// generous for a loaded two-core machine, short enough that a stuck page fails the test
// rather than CI's timeout.
const uiStep = 30 * time.Second

// findBrowser is the Chromium to drive, or skips the test without one (a developer's
// machine without a browser); FLOW_REQUIRE_BROWSER (set by .ci/run, which installs
// Chromium) makes a missing browser a failure instead.
func findBrowser(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("FLOW_REQUIRE_BROWSER") != "" {
		t.Fatal("no chromium or chromium-browser on PATH, and FLOW_REQUIRE_BROWSER is set (.ci/run installs it with apt-get)")
	}
	t.Skip("no chromium or chromium-browser on PATH (apt-get install chromium); FLOW_REQUIRE_BROWSER=1 makes this a failure")
	return ""
}

// screenshotDir is where the screenshots go, kept after the test as its artifacts:
// FLOW_UI_SCREENSHOTS (relative to the repository's root: FLOW_UI_SCREENSHOTS=docs/img
// makes docs/ui.md's images; .ci/run sets one), or flow-ui-screenshots in the system's
// temporary directory.
func screenshotDir(t *testing.T) string {
	dir := os.Getenv("FLOW_UI_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "flow-ui-screenshots")
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join("..", "..", "..", dir) // the test runs in internal/testkit/clustertest
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// browser is one tab of a headless Chromium on a flowd's UI.
type browser struct {
	ctx   context.Context // the tab's
	base  string          // http://host:port of the UI
	shots string          // the screenshots' directory
}

// startBrowser starts Chromium with a 1100px-wide window (the screenshots' width) and
// opens a tab; the test's cleanup closes the browser and waits for its process, so
// that neither it nor chromedp's goroutines outlive the test (goleak in TestMain).
func startBrowser(t *testing.T, execPath, base, shots string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(execPath),
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.WindowSize(1100, 800),
	)
	if os.Getuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium's sandbox refuses to run as root
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc() // waits for the browser's process
	})
	openTab(t, ctx, cancelTab, "start "+execPath)
	return &browser{ctx: ctx, base: base, shots: shots}
}

// openTab makes the first action of the tab ctx, which starts the browser or opens the
// tab. Its context must be ctx itself, not one with a deadline (the browser or tab
// would end with that context): the deadline cancels ctx instead.
func openTab(t *testing.T, ctx context.Context, cancel context.CancelFunc, what string) {
	t.Helper()
	timer := time.AfterFunc(uiStep, cancel)
	err := chromedp.Do(ctx, chromedp.Navigate("about:blank"))
	if !timer.Stop() {
		t.Fatalf("%s: not done within %s", what, uiStep)
	}
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// tab is another tab of b's browser, in a browser context of its own (its own cookies:
// a second flowd on the same host would otherwise share the session cookie's name).
func (b *browser) tab(t *testing.T, base string) *browser {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.ctx, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	openTab(t, ctx, cancel, "open a tab")
	return &browser{ctx: ctx, base: base, shots: b.shots}
}

// do runs actions with a deadline and fails the test with what it was doing.
func (b *browser) do(t *testing.T, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, uiStep)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// value runs an action that returns a value, with a deadline.
func value[T any](t *testing.T, b *browser, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, uiStep)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// open navigates to a UI path and waits for its load.
func (b *browser) open(t *testing.T, path string) {
	t.Helper()
	b.do(t, "open "+path, chromedp.Navigate(b.base+path))
}

// follow clicks what sel selects (a link, a form's button) and waits for the page it
// leads to to load.
func (b *browser) follow(t *testing.T, sel string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, uiStep)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.WaitEvent(page.LoadEventFired, nil, chromedp.Click(chromedp.CSS(sel)))); err != nil {
		t.Fatalf("click %s and wait for the next page: %v", sel, err)
	}
}

// js evaluates an expression in the page.
func js[T any](t *testing.T, b *browser, expr string) T {
	t.Helper()
	return value(t, b, "evaluate "+expr, chromedp.Evaluate[T](expr))
}

// waitJS waits until expr is true in the page: polled by the page itself on each
// animation frame, with the step's deadline.
func (b *browser) waitJS(t *testing.T, what, expr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, uiStep)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(uiStep))); err != nil {
		t.Fatalf("waiting for %s (%s): %v; the page shows:\n%s", what, expr, err, b.mainText(t))
	}
}

// mainText is the page's main part as text (for failure messages).
func (b *browser) mainText(t *testing.T) string {
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.getElementById("main") || document.body).innerText`))
	if err != nil {
		return fmt.Sprintf("(no text: %v)", err)
	}
	return s
}

// path is the page's location path.
func (b *browser) path(t *testing.T) string {
	t.Helper()
	return js[string](t, b, `location.pathname`)
}

// count is how many elements sel selects.
func (b *browser) count(t *testing.T, sel string) int {
	t.Helper()
	return js[int](t, b, fmt.Sprintf(`document.querySelectorAll(%q).length`, sel))
}

// text is the text of the first element sel selects, as shown ("" if none; an SVG
// element has no innerText, only its textContent).
func (b *browser) text(t *testing.T, sel string) string {
	t.Helper()
	return js[string](t, b, fmt.Sprintf(`(function(){ var e = document.querySelector(%q); return e ? (e.innerText ?? e.textContent).trim() : ""; })()`, sel))
}

// screenshot saves the whole page as NAME-light.png and NAME-dark.png, the dark one
// with the system's scheme emulated (prefers-color-scheme: dark, which ui.css follows).
func (b *browser) screenshot(t *testing.T, name string) {
	t.Helper()
	for _, scheme := range []string{"dark", "light"} { // light last: the tab stays light
		ctx, cancel := context.WithTimeout(b.ctx, uiStep)
		_, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}}})
		var png []byte
		if err == nil {
			png, err = chromedp.Run(ctx, chromedp.FullScreenshot(100)) // 100: PNG
		}
		cancel()
		if err != nil {
			t.Fatalf("screenshot %s (%s): %v", name, scheme, err)
		}
		if err := os.WriteFile(filepath.Join(b.shots, name+"-"+scheme+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// runOf is run id as flowctl sees it (as user, when given).
func runOf(t *testing.T, url, id string, as ...string) client.Run {
	t.Helper()
	var r client.Run
	code, out := flowctl(url, append(as, "run", "get", id, "-o", "json")...)
	if code == 0 {
		_ = json.Unmarshal([]byte(out), &r)
	}
	return r
}

// mustFlowctl runs flowctl and fails the test on a non-zero exit.
func mustFlowctl(t *testing.T, url string, args ...string) string {
	t.Helper()
	code, out := flowctl(url, args...)
	if code != 0 {
		t.Fatalf("flowctl %s: exit %d: %s", strings.Join(args, " "), code, out)
	}
	return out
}

// applyYAML writes a workflow to dir and applies it with flowctl.
func applyYAML(t *testing.T, url, dir, name, body string, as ...string) {
	t.Helper()
	file := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	mustFlowctl(t, url, append(as, "workflow", "apply", "-f", file)...)
}

// deadLetter gets the runs ids of a workflow dead-lettered by the engine, as a poison run
// is (TestPoisonRunEndsInTheDLQ): with max_epochs 1, flowd is SIGKILLed twice while it
// runs them and started again each time; each restart reclaims them with a new epoch
// that counts (their owner was lost), and the second is one more than max_epochs. The
// step holds if the file gate exists when it starts, so that once it is removed a retry
// succeeds; it execs its sleep so that the parent-death signal flowd sets on the step's
// process ends the sleep with flowd (a child of sh would outlive it).
func deadLetter(t *testing.T, node *Proc, url, dir, gate string, ids ...string) {
	t.Helper()
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	applyYAML(t, url, dir, "poison", fmt.Sprintf(`name: poison
description: holds while a file exists; its node is killed under it
max_epochs: 1
steps:
  - name: hold
    uses: exec
    with: {command: [sh, -c, "if [ -e %s ]; then exec sleep 600; fi; echo '{\"released\": true}'"]}
`, gate))
	for _, id := range ids {
		mustFlowctl(t, url, "run", "start", "poison", "--id", id)
	}
	for kill := 1; kill <= 2; kill++ {
		WaitFor(t, 60*time.Second, fmt.Sprintf("the poison runs running with %d epoch changes", kill-1), func() bool {
			for _, id := range ids {
				if r := runOf(t, url, id); r.Status != "running" || r.Owner == "" || r.EpochChanges != kill-1 {
					return false
				}
			}
			return true
		})
		node.Kill()
		node.Restart(t)
		WaitFor(t, 60*time.Second, "flowd ready again", func() bool {
			return strings.Count(LogOf(node), "flowd ready") == kill+1 || !node.Alive()
		})
		if !node.Alive() {
			t.Fatalf("flowd did not start again:\n%s", tail(LogOf(node)))
		}
	}
	WaitFor(t, 60*time.Second, "the poison runs dead-lettered", func() bool {
		for _, id := range ids {
			if runOf(t, url, id).Status != "dead_lettered" {
				return false
			}
		}
		return true
	})
}

// TestUI clicks through flowd's web UI in a headless Chromium: a foreach run's graph,
// step and output; the fenced commit of `flowctl drill zombie`; the keyboard and 200%
// zoom; a DLQ retry and a purge; a running run's page that follows the run without a
// reload; hostile outputs shown as text; and with --auth, each role's buttons. It saves screenshots of the main pages in
// the light and the dark scheme.
func TestUI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts flowd and a browser")
	}
	chromium := findBrowser(t)
	Binaries(t) // built before the clock starts
	started := time.Now()
	dir := t.TempDir()
	node, url, httpAddr := embeddedFlowd(t, append([]string{"--lease-ttl", "1s"}, stepsAsTestUser()...)...) // its steps read the test's files

	// First, while no page is open: the dead-lettered runs, which take two restarts of
	// flowd.
	gate := filepath.Join(dir, "gate")
	deadLetter(t, node, url, dir, gate, "poison-1", "poison-2")
	if err := os.Remove(gate); err != nil { // a retried poison run now finishes
		t.Fatal(err)
	}
	t.Logf("two runs dead-lettered after %s", time.Since(started).Round(time.Millisecond))

	b := startBrowser(t, chromium, "http://"+httpAddr, screenshotDir(t))
	defer func() {
		t.Logf("screenshots in %s; the test took %s", b.shots, time.Since(started).Round(time.Millisecond))
	}()

	t.Run("foreach run, step and output", func(t *testing.T) {
		applyYAML(t, url, dir, "fan", `name: fan
description: a list, then one item of work per colour
steps:
  - name: list
    uses: exec
    with: {command: [echo, '{"colours": ["red", "green", "blue"]}']}
  - name: paint
    needs: [list]
    foreach: "{{ steps.list.output.colours }}"
    uses: exec
    with: {command: [echo, '{"painted": "{{ item }}"}']}
  - name: report
    needs: [paint]
    uses: noop
`)
		mustFlowctl(t, url, "run", "start", "fan", "--id", "fan-1", "--wait")
		// The runs page by a date range, typed in its filter form: the last hour has fan-1,
		// a range that ended an hour ago has no run.
		b.open(t, "/ui/")
		b.do(t, "filter the runs page by the last hour",
			chromedp.SendKeys(chromedp.CSS(`form.filters input[name="since"]`), "1h"))
		b.follow(t, `form.filters button[type="submit"]`)
		if n := b.count(t, `table.runs a[href="/ui/runs/fan-1"]`); n != 1 {
			t.Fatalf("the last hour's runs page lists fan-1 %d times:\n%s", n, b.mainText(t))
		}
		b.open(t, "/ui/?until=1h")
		if s := b.mainText(t); !strings.Contains(s, "No runs match this filter") {
			t.Fatalf("the runs page before an hour ago says %q", s)
		}
		b.open(t, "/ui/")
		b.follow(t, `table.runs a[href="/ui/runs/fan-1"]`)
		if p := b.path(t); p != "/ui/runs/fan-1" {
			t.Fatalf("the run's link led to %s", p)
		}
		// The graph: each step a node with its state in words, the foreach's progress.
		if n := b.count(t, `svg a.node`); n != 3 {
			t.Fatalf("the graph has %d step nodes, want 3", n)
		}
		if w := b.text(t, `svg a[href="#step-paint"] text.word`); w != "succeeded 3/3" {
			t.Fatalf("the foreach node says %q, want \"succeeded 3/3\"", w)
		}
		b.do(t, "click the step paint in the graph", chromedp.Click(chromedp.CSS(`svg a[href="#step-paint"]`)))
		b.waitJS(t, "the step's section to be the target", `location.hash === "#step-paint" && document.querySelector("#step-paint:target") !== null`)
		if b.count(t, `#step-paint details[open]`) != 0 {
			t.Fatal("the output is open before it was clicked: outputs are collapsed")
		}
		b.do(t, "open the output", chromedp.Click(chromedp.CSS(`#step-paint details > summary`)))
		b.waitJS(t, "the output's details to open", `document.querySelector("#step-paint details").open`)
		out := b.text(t, `#step-paint details pre`)
		var items []map[string]string
		if err := json.Unmarshal([]byte(out), &items); err != nil || len(items) != 3 || items[0]["painted"] != "red" || items[2]["painted"] != "blue" {
			t.Fatalf("the output shown is %q (%v), want the three items' outputs in order", out, err)
		}
		// By keyboard: the graph's links take the focus and Enter follows them.
		b.do(t, "focus the step list in the graph and press Enter",
			chromedp.Focus(chromedp.CSS(`svg a[href="#step-list"]`)), chromedp.KeyEvent("\r"))
		b.waitJS(t, "Enter on a graph node to follow it", `location.hash === "#step-list"`)
	})

	var drill client.Drill
	t.Run("fenced commit of drill zombie", func(t *testing.T) {
		out := mustFlowctl(t, url, "drill", "zombie", "-o", "json")
		if err := json.Unmarshal([]byte(out), &drill); err != nil || len(drill.Run.Fenced) == 0 {
			t.Fatalf("drill zombie said %q (%v)", out, err)
		}
		f := drill.Run.Fenced[0]
		b.open(t, "/ui/runs/"+drill.Run.ID)
		b.do(t, "the fenced commits' table", chromedp.WaitVisible(chromedp.CSS(`table.fenced tr.fenced-row`)))
		cells := js[[]string](t, b, `Array.from(document.querySelectorAll("tr.fenced-row")[0].cells, c => c.innerText.trim())`)
		// Step, Item, Its epoch, The run's epoch, Tried by, Why, At.
		want := []string{f.Step, "-", fmt.Sprint(f.Epoch), fmt.Sprint(f.CurrentEpoch), f.Owner}
		if len(cells) != 7 || !slices.Equal(cells[:5], want) || cells[5] == "" {
			t.Fatalf("the fenced row shows %q, want %q then the reason and the time", cells, want)
		}
		if f.Epoch == f.CurrentEpoch || f.Owner == "" {
			t.Fatalf("the drill's fenced commit: %+v", f)
		}
		if n := b.count(t, `ol.timeline li`); n != len(drill.Run.Epochs) || n < 2 {
			t.Fatalf("the epochs' timeline has %d entries, the run %d", n, len(drill.Run.Epochs))
		}
		// The Gantt: a bar per step that ran, in the steps' order and starting no earlier
		// than the one before; a line per epoch; the fenced commit marked on its step's row.
		bars := js[[][]float64](t, b, `Array.from(document.querySelectorAll(".gantt g.row"), g => { const r = g.querySelector("rect"); return r ? [r.x.baseVal.value, r.width.baseVal.value, g.querySelector("text").y.baseVal[0].value] : [-1, 0, 0]; })`)
		names := js[[]string](t, b, `Array.from(document.querySelectorAll(".gantt g.row text.name"), e => e.textContent)`)
		var stepNames []string
		for _, st := range drill.Run.Steps {
			stepNames = append(stepNames, st.Name)
		}
		if !slices.Equal(names, stepNames) {
			t.Fatalf("the timeline's rows are %q, the run's steps %q", names, stepNames)
		}
		for i, bar := range bars {
			if bar[0] < 0 || bar[1] <= 0 || i > 0 && bar[0] < bars[i-1][0] {
				t.Fatalf("the timeline's bars (x, width, y): %v: step %d has no bar or starts before the one before", bars, i)
			}
		}
		if n := b.count(t, `.gantt g.epoch`); n != len(drill.Run.Epochs) {
			t.Fatalf("the timeline draws %d epochs, the run has %d", n, len(drill.Run.Epochs))
		}
		if n := b.count(t, `.gantt g.fenced-mark`); n != len(drill.Run.Fenced) {
			t.Fatalf("the timeline marks %d fenced commits, the run has %d", n, len(drill.Run.Fenced))
		}
		b.screenshot(t, "run")
		b.open(t, "/ui/")
		b.screenshot(t, "runs")
		b.open(t, "/ui/cluster")
		if s := b.text(t, `main p`); !strings.Contains(s, "Leader node-a") {
			t.Fatalf("the cluster page says %q", s)
		}
		b.screenshot(t, "cluster")
	})

	t.Run("keyboard and 200% zoom", func(t *testing.T) {
		// The first Tab reaches the skip link, and following it puts the focus on the
		// page's content.
		b.open(t, "/ui/")
		b.do(t, "press Tab", chromedp.KeyEvent("\t"))
		if f := js[string](t, b, `document.activeElement.className + " " + document.activeElement.getAttribute("href")`); f != "skip #main" {
			t.Fatalf("the first Tab focuses %q, want the skip link", f)
		}
		b.do(t, "press Enter on the skip link", chromedp.KeyEvent("\r"))
		b.waitJS(t, "the focus on the content", `document.activeElement.id === "main"`)
		// At 200% the 1100px window is 550 CSS pixels wide: no page may need a sideways
		// scroll as a whole (wide tables and the graph scroll in their own boxes).
		b.do(t, "zoom to 200%", chromedp.EmulateViewport(550, 800, chromedp.EmulateScale(2)))
		defer func() { // back to the window's own size (ResetViewport keeps a 550px width)
			ctx, cancel := context.WithTimeout(b.ctx, uiStep)
			defer cancel()
			if _, err := chromedp.Call(ctx, emulation.ClearDeviceMetricsOverride, cdp.Empty{}); err != nil {
				t.Fatalf("zoom back: %v", err)
			}
		}()
		pages := []string{"/ui/", "/ui/dlq", "/ui/cluster", "/ui/workflows", "/ui/cron", "/ui/runs/fan-1"}
		if drill.Run.ID != "" {
			pages = append(pages, "/ui/runs/"+drill.Run.ID)
		}
		for _, p := range pages {
			b.open(t, p)
			w := js[[]int](t, b, `[document.documentElement.scrollWidth, document.documentElement.clientWidth]`)
			if w[1] > 550 {
				t.Fatalf("%s: the window is %d CSS pixels wide: the zoom did not apply", p, w[1])
			}
			if w[0] > w[1] {
				t.Errorf("%s at 200%% zoom is %d CSS pixels wide in a %d-pixel window", p, w[0], w[1])
			}
		}
	})

	t.Run("DLQ retry and purge", func(t *testing.T) {
		b.open(t, "/ui/dlq")
		for _, id := range []string{"poison-1", "poison-2"} {
			if b.count(t, fmt.Sprintf(`section.dead a[href="/ui/runs/%s"]`, id)) != 1 {
				t.Fatalf("%s is not in the DLQ page:\n%s", id, b.mainText(t))
			}
		}
		b.screenshot(t, "dlq")
		b.follow(t, `form[action="/ui/dlq/poison-1/retry"] button`)
		if p := b.path(t); p != "/ui/runs/poison-1" {
			t.Fatalf("the retry led to %s:\n%s", p, b.mainText(t))
		}
		// Retried, the run resumes (its gate is gone) and its page follows it.
		b.waitJS(t, "the retried run to succeed", `document.querySelector(".summary .status").innerText.trim() === "succeeded"`)
		b.open(t, "/ui/dlq")
		if b.count(t, `section.dead a[href="/ui/runs/poison-1"]`) != 0 || b.count(t, `section.dead a[href="/ui/runs/poison-2"]`) != 1 {
			t.Fatalf("after the retry the DLQ shows:\n%s", b.mainText(t))
		}
		// Purge asks first, on a page of its own.
		b.follow(t, `a[href="/ui/dlq/poison-2/purge"]`)
		if h := b.text(t, "main h1"); h != "Purge poison-2?" {
			t.Fatalf("the purge link led to %q", h)
		}
		b.follow(t, `form[action="/ui/dlq/poison-2/purge"] button`)
		if p := b.path(t); p != "/ui/dlq" || b.count(t, "section.dead") != 0 {
			t.Fatalf("after the purge (%s):\n%s", p, b.mainText(t))
		}
		if r := runOf(t, url, "poison-2"); r.Status != "cancelled" {
			t.Fatalf("the purged run is %q", r.Status)
		}
	})

	t.Run("a running run's page follows it without a reload", func(t *testing.T) {
		applyYAML(t, url, dir, "nap", `name: nap
steps:
  - name: doze
    uses: sleep
    with: {duration: 3s}
  - name: wake
    needs: [doze]
    uses: noop
`)
		mustFlowctl(t, url, "run", "start", "nap", "--id", "nap-1")
		b.open(t, "/ui/runs/nap-1")
		if b.count(t, "[data-events]") != 1 || b.count(t, ".livebadge") != 1 {
			t.Fatalf("the page of a run that sleeps 3s is not live:\n%s", b.mainText(t))
		}
		if s := b.text(t, ".summary .status"); s == "succeeded" {
			t.Fatalf("the run is %s already", s)
		}
		// A mark on the page's window: a reload or a navigation would lose it.
		js[chromedp.Void](t, b, `window.__sameDocument = "nap-1"`)
		b.waitJS(t, "the page to show the run succeeded", `document.querySelector(".summary .status").innerText.trim() === "succeeded"`)
		if mark := js[string](t, b, `String(window.__sameDocument)`); mark != "nap-1" {
			t.Fatalf("the page was reloaded (its mark is %q): it must update in place", mark)
		}
		if w := b.text(t, `#step-wake .status`); w != "succeeded" {
			t.Fatalf("the step after the sleep shows %q", w)
		}
		if b.count(t, "[data-events]") != 0 || b.count(t, ".livebadge") != 0 {
			t.Fatal("the finished run's page still says it is live")
		}
	})

	t.Run("a running step's log is shown as it prints", func(t *testing.T) {
		// Two gates: the step prints a line, waits, prints a hostile line to stderr, waits
		// again; the second line can reach the page only through its log's poll (nothing
		// of the run changes meanwhile). The run's end then swaps the page's main part,
		// which must keep each line once.
		gate1, gate2 := filepath.Join(dir, "log-gate-1"), filepath.Join(dir, "log-gate-2")
		applyYAML(t, url, dir, "chatty", fmt.Sprintf(`name: chatty
steps:
  - name: speak
    uses: exec
    with: {command: [sh, -c, "echo 'hello from speak'; while [ ! -e %s ]; do sleep 0.05; done; echo '<b id=bold>not bold</b>' >&2; while [ ! -e %s ]; do sleep 0.05; done"]}
`, gate1, gate2))
		mustFlowctl(t, url, "run", "start", "chatty", "--id", "chatty-1")
		b.open(t, "/ui/runs/chatty-1")
		lines := `Array.from(document.querySelectorAll("#step-speak details.log li"), li => li.className + " " + li.querySelector(".lt").textContent)`
		b.waitJS(t, "the log to show the step's first line", lines+`.join("|") === "ls-stdout hello from speak"`)
		if !js[bool](t, b, `document.querySelector("#step-speak details.log").open`) {
			t.Fatal("a running step's log is collapsed: want it open")
		}
		js[chromedp.Void](t, b, `window.__sameDocument = "chatty-1"`)
		if err := os.WriteFile(gate1, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		b.waitJS(t, "the hostile stderr line, as text", lines+`.join("|") === "ls-stdout hello from speak|ls-stderr <b id=bold>not bold</b>"`)
		if s := b.text(t, ".summary .status"); s != "running" {
			t.Fatalf("the run is %s: the line may have come with the run's end, not the log's poll", s)
		}
		if err := os.WriteFile(gate2, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		b.waitJS(t, "the run to succeed", `document.querySelector(".summary .status").innerText.trim() === "succeeded"`)
		if got := js[[]string](t, b, lines); len(got) != 2 {
			t.Fatalf("after the run's end the log shows %q; want its two lines, once each", got)
		}
		if mark := js[string](t, b, `String(window.__sameDocument)`); mark != "chatty-1" {
			t.Fatalf("the page was reloaded (its mark is %q)", mark)
		}
		if js[bool](t, b, `document.getElementById("bold") !== null`) {
			t.Fatal("the hostile line became an element")
		}
		if hover := js[string](t, b, `document.querySelector("#step-speak details.log time").title`); !strings.HasSuffix(hover, " UTC") {
			t.Fatalf("a line's time has %q on hover; want the UTC time", hover)
		}
		b.screenshot(t, "run-logs")
	})

	t.Run("hostile output is shown as text", func(t *testing.T) {
		hostile := filepath.Join(dir, "hostile.json")
		body := `{"img": "<img src=x onerror=\"window.__pwned=1\">", "script": "</code></pre><script>window.__pwned=2</script>"}`
		if err := os.WriteFile(hostile, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		applyYAML(t, url, dir, "hostile", fmt.Sprintf(`name: hostile
description: "<img src=x onerror=\"window.__pwned=3\">"
steps:
  - name: speak
    uses: exec
    with: {command: [cat, %s]}
`, hostile))
		mustFlowctl(t, url, "run", "start", "hostile", "--id", "hostile-1", "--wait")
		b.open(t, "/ui/runs/hostile-1")
		b.do(t, "open the output", chromedp.Click(chromedp.CSS(`#step-speak details > summary`)))
		b.waitJS(t, "the output's details to open", `document.querySelector("#step-speak details").open`)
		out := b.text(t, `#step-speak details pre`)
		for _, lit := range []string{`<img src=x onerror=\"window.__pwned=1\">`, `</code></pre><script>window.__pwned=2</script>`} {
			if !strings.Contains(out, lit) {
				t.Errorf("the output does not show %s literally: %q", lit, out)
			}
		}
		check := func(page string) {
			if n := b.count(t, "main img, main script"); n != 0 {
				t.Errorf("%s: the hostile text became %d elements", page, n)
			}
			if v := js[string](t, b, `typeof window.__pwned`); v != "undefined" {
				t.Errorf("%s: the hostile text ran: window.__pwned is %s", page, v)
			}
		}
		check("the run page")
		b.open(t, "/ui/workflows")
		if d := b.text(t, `a[href="/ui/workflows/hostile"] + br + .dim`); d != `<img src=x onerror="window.__pwned=3">` {
			t.Errorf("the workflows page shows the description as %q", d)
		}
		check("the workflows page")
		b.open(t, "/ui/workflows/hostile")
		check("the workflow page")
	})

	t.Run("with --auth each role sees its actions", func(t *testing.T) {
		users := filepath.Join(t.TempDir(), "users.yaml")
		if err := os.WriteFile(users, []byte(authUsers), 0o600); err != nil {
			t.Fatal(err)
		}
		_, aurl, ahttp := embeddedFlowd(t, "--auth", users, "--lease-ttl", "1s")
		otto := []string{"--user", "otto", "--password", authPasswords["otto"]}
		applyYAML(t, aurl, dir, "slow", slowStep, otto...)
		applyYAML(t, aurl, dir, "broken", "name: broken\nsteps:\n  - name: a\n    uses: exec\n    with: {command: [sh, -c, \"exit 3\"]}\n", otto...)
		mustFlowctl(t, aurl, append(otto, "run", "start", "slow", "--id", "held")...)
		mustFlowctl(t, aurl, append(otto, "run", "start", "broken", "--id", "broke")...)
		WaitFor(t, 60*time.Second, "held running and broke failed", func() bool {
			return runOf(t, aurl, "held", otto...).Status == "running" && runOf(t, aurl, "broke", otto...).Status == "failed"
		})
		a := b.tab(t, "http://"+ahttp)
		signIn := func(user string) {
			t.Helper()
			a.open(t, "/ui/runs/held")
			if p := a.path(t); p != "/ui/login" {
				t.Fatalf("signed out, the run's page led to %s", p)
			}
			a.do(t, "fill the sign-in form",
				chromedp.SendKeys(chromedp.CSS(`input[name="user"]`), user),
				chromedp.SendKeys(chromedp.CSS(`input[name="password"]`), authPasswords[user]))
			a.follow(t, `form.login button[type="submit"]`)
			if p := a.path(t); p != "/ui/runs/held" {
				t.Fatalf("signed in as %s, the page is %s:\n%s", user, p, a.mainText(t))
			}
			if who := a.text(t, "header .who span"); !strings.Contains(who, user) {
				t.Fatalf("the header says %q, want %s", who, user)
			}
		}
		actions := func() (cancel, retry int) {
			t.Helper()
			a.open(t, "/ui/runs/held")
			cancel = a.count(t, `form[action="/ui/runs/held/cancel"] button`)
			a.open(t, "/ui/runs/broke")
			// The plain Retry (the "Retry from step" form below it, issue 27, is counted apart).
			retry = a.count(t, `form[action="/ui/runs/broke/retry"]:not(.retry-from form) button`)
			if from := a.count(t, `details.retry-from form[action="/ui/runs/broke/retry"] button`); from != retry {
				t.Fatalf("%d Retry buttons but %d Retry from step forms", retry, from)
			}
			return cancel, retry
		}
		signIn("vera")
		if c, r := actions(); c != 0 || r != 0 {
			t.Fatalf("a viewer sees %d cancel and %d retry buttons", c, r)
		}
		a.follow(t, `header .who button[type="submit"]`)
		if p := a.path(t); p != "/ui/login" {
			t.Fatalf("signing out led to %s", p)
		}
		signIn("otto")
		if c, r := actions(); c != 1 || r != 1 {
			t.Fatalf("an operator sees %d cancel and %d retry buttons, want one of each", c, r)
		}
		// The operator's cancel: a POST with the session's CSRF token, in the history
		// with the operator's name.
		a.open(t, "/ui/runs/held")
		a.follow(t, `form[action="/ui/runs/held/cancel"] button`)
		a.waitJS(t, "the run cancelled", `document.querySelector(".summary .status").innerText.trim() === "cancelled"`)
		if by := js[bool](t, a, `Array.from(document.querySelectorAll("table.history tbody tr"), r => r.cells[5].innerText.trim()).includes("otto")`); !by {
			t.Errorf("the history does not name otto as who cancelled:\n%s", a.mainText(t))
		}

		// A run waiting for two approvals, approved by ann: the page says 1 of 2 so far,
		// by ann, with her approval's time in the viewer's zone (the UTC on hover).
		applyYAML(t, aurl, dir, "two", "name: two\nsteps:\n  - {name: ok, uses: approval, with: {approvers: {role: operator, count: 2}}}\n", otto...)
		mustFlowctl(t, aurl, append(otto, "run", "start", "two", "--id", "two-1")...)
		WaitFor(t, 60*time.Second, "two-1 waiting", func() bool { return runOf(t, aurl, "two-1", otto...).Status == "waiting" })
		mustFlowctl(t, aurl, "--user", "ann", "--password", authPasswords["ann"], "run", "approve", "two-1", "--comment", "totals match")
		WaitFor(t, 30*time.Second, "ann's approval applied", func() bool { return len(runOf(t, aurl, "two-1", otto...).Decisions) == 1 })
		a.open(t, "/ui/runs/two-1")
		if s := a.text(t, "section.waiting"); !strings.Contains(s, "1 of 2 so far, by ann") || !strings.Contains(s, "approved by ann") || !strings.Contains(s, "totals match") {
			t.Fatalf("the waiting run's page says %q; want its approvals so far, who and when", s)
		}
		if hover := js[string](t, a, `document.querySelector("ul.decisions time").title`); !strings.HasSuffix(hover, " UTC") {
			t.Fatalf("the approval's time has %q on hover; want the UTC time", hover)
		}
		a.screenshot(t, "waiting-approval")
	})
}

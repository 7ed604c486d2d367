package webui

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine"
)

// The cron page: an operator pauses a schedule with a reason (the form asks for one)
// and the page shows it paused, by whom and why, with a Resume button; a viewer sees the
// pause but no button, and her POST is refused; a POST without the CSRF token changes
// nothing; the resume ends the pause. A backfilled tick is styled as its outcome.
func TestCronPagePauseResume(t *testing.T) {
	n := startPeopleNode(t)
	n.apply(t, "name: nightly\nschedule:\n  cron: \"30 2 * * *\"\n  timezone: Europe/Amsterdam\nsteps:\n  - {name: a, uses: noop}\n")
	now := time.Now()
	if _, err := n.e.Ops().Backfill(ctxT(t), "nightly", engine.BackfillOptions{From: now.AddDate(0, 0, -2), To: now}); err != nil {
		t.Fatal(err)
	}
	signIn := func(user, pw string) *http.Client {
		c := browser(t)
		if code, _ := post(t, c, n.srv.URL+"/ui/login", url.Values{"user": {user}, "password": {pw}, "next": {"/ui/"}}, nil); code != http.StatusSeeOther {
			t.Fatalf("%s's sign-in: %d", user, code)
		}
		return c
	}
	otto, vera := signIn("otto", "o-pw"), signIn("vera", "v-pw")
	paused := func() bool {
		st, err := n.e.Ops().ScheduleState("nightly")
		if err != nil {
			t.Fatal(err)
		}
		return st != nil && st.Paused
	}

	_, page := get(t, otto, n.srv.URL+"/ui/cron")
	if !strings.Contains(page, `action="/ui/cron/nightly/pause"`) || !strings.Contains(page, `name="reason" required`) || strings.Contains(page, "/resume") {
		t.Fatalf("an operator's cron page of a running schedule:\n%s", page)
	}
	if !strings.Contains(page, `class="tick t-backfilled">backfilled<`) {
		t.Fatalf("the cron page does not style the backfilled ticks:\n%s", page)
	}
	if _, vpage := get(t, vera, n.srv.URL+"/ui/cron"); strings.Contains(vpage, "/pause") {
		t.Fatalf("a viewer's cron page has the pause form")
	}
	pause := n.srv.URL + "/ui/cron/nightly/pause"
	if code, _ := post(t, otto, pause, url.Values{"reason": {"incident 42"}}, nil); code != http.StatusForbidden || paused() {
		t.Fatalf("a pause without the CSRF token: %d, paused %v", code, paused())
	}
	if code, _ := post(t, otto, pause, url.Values{"csrf": {csrfOf(t, page)}, "reason": {"incident <42>"}}, nil); code != http.StatusSeeOther || !paused() {
		t.Fatalf("the pause: %d, paused %v", code, paused())
	}
	_, page = get(t, otto, n.srv.URL+"/ui/cron")
	if !strings.Contains(page, "<b>Paused</b> by otto since <time datetime=") || !strings.Contains(page, ": incident &lt;42&gt;.") || !strings.Contains(page, `action="/ui/cron/nightly/resume"`) {
		t.Fatalf("the cron page of a paused schedule:\n%s", page)
	}
	_, vpage := get(t, vera, n.srv.URL+"/ui/cron")
	if !strings.Contains(vpage, "<b>Paused</b> by otto") || strings.Contains(vpage, "/resume") {
		t.Fatalf("a viewer's cron page of a paused schedule:\n%s", vpage)
	}
	if code, body := post(t, vera, n.srv.URL+"/ui/cron/nightly/resume", url.Values{"csrf": {csrfOf(t, vpage)}}, nil); code != http.StatusForbidden || !strings.Contains(body, "needs the operator role") || !paused() {
		t.Fatalf("a viewer's resume: %d %s", code, body)
	}
	if code, _ := post(t, otto, n.srv.URL+"/ui/cron/nightly/resume", url.Values{"csrf": {csrfOf(t, page)}}, nil); code != http.StatusSeeOther || paused() {
		t.Fatalf("the resume: %d, paused %v", code, paused())
	}
	if st, _ := n.e.Ops().ScheduleState("nightly"); st.Actor != "otto" || st.ResumedBy != "otto" || st.Reason != "incident <42>" {
		t.Fatalf("the schedule's state: %+v", st)
	}
}

// The run page of a run that ended has a "Retry from step" form for operators (the
// failed step selected); retrying from it with an input changed runs that step again
// and not the one before it. A viewer has no form; a malformed input retries nothing.
func TestRunPageRetryFromStep(t *testing.T) {
	n := startPeopleNode(t)
	n.apply(t, "name: chain\ninputs:\n  day: {type: string}\nsteps:\n  - {name: a, uses: noop}\n"+
		"  - name: b\n    needs: [a]\n    uses: exec\n    retry: {max_attempts: 1}\n    with: {command: [sh, -c, 'test {{ inputs.day }} = x']}\n")
	if _, err := n.e.StartRun(ctxT(t), "chain", map[string]any{"day": "y"}, engine.RunOptions{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	before := n.waitUntil(t, "c1", client.Run.Terminal)
	if before.Status != "failed" {
		t.Fatalf("the first run: %s", before.Status)
	}
	signIn := func(user, pw string) *http.Client {
		c := browser(t)
		if code, _ := post(t, c, n.srv.URL+"/ui/login", url.Values{"user": {user}, "password": {pw}, "next": {"/ui/"}}, nil); code != http.StatusSeeOther {
			t.Fatalf("%s's sign-in: %d", user, code)
		}
		return c
	}
	otto, vera := signIn("otto", "o-pw"), signIn("vera", "v-pw")
	_, page := get(t, otto, n.srv.URL+"/ui/runs/c1")
	if !strings.Contains(page, "Retry from step") || !strings.Contains(page, `<option value="a">a</option><option value="b" selected>b</option>`) {
		t.Fatalf("an operator's page of a failed run:\n%s", page)
	}
	if _, vpage := get(t, vera, n.srv.URL+"/ui/runs/c1"); strings.Contains(vpage, "Retry from step") {
		t.Fatalf("a viewer's page has the retry-from form")
	}
	retry := n.srv.URL + "/ui/runs/c1/retry"
	if code, body := post(t, otto, retry, url.Values{"csrf": {csrfOf(t, page)}, "from": {"b"}, "inputs": {"day"}}, nil); code != http.StatusBadRequest || !strings.Contains(body, "KEY=VALUE") {
		t.Fatalf("a malformed input: %d %s", code, body)
	}
	if r, _ := n.e.API().Run("c1"); r.Epoch != before.Epoch {
		t.Fatalf("a malformed input retried the run")
	}
	if code, body := post(t, otto, retry, url.Values{"csrf": {csrfOf(t, page)}, "from": {"b"}, "inputs": {"day=x\n"}}, nil); code != http.StatusSeeOther {
		t.Fatalf("the retry from b: %d %s", code, body)
	}
	r := n.waitUntil(t, "c1", func(r client.Run) bool { return r.Terminal() && r.Epoch != before.Epoch })
	if r.Status != "succeeded" || r.Steps[0].Epoch != before.Steps[0].Epoch || r.Steps[1].Epoch == before.Steps[1].Epoch || !strings.Contains(string(r.Inputs), `"day":"x"`) {
		t.Fatalf("after the retry from b: %s, steps %+v (before %+v), inputs %s", r.Status, r.Steps, before.Steps, r.Inputs)
	}
}

// Backfill from the cron page (issue 27): an operator backfills a range of dates; the
// ticks without a run get one each, with the tick's run ID; a viewer has no form and
// her POST is refused.
func TestCronPageBackfill(t *testing.T) {
	n := startPeopleNode(t)
	n.apply(t, "name: nightly\nschedule:\n  cron: \"0 2 * * *\"\n  timezone: Asia/Jakarta\nsteps:\n  - {name: a, uses: noop}\n")
	signIn := func(user, pw string) *http.Client {
		c := browser(t)
		if code, _ := post(t, c, n.srv.URL+"/ui/login", url.Values{"user": {user}, "password": {pw}, "next": {"/ui/"}}, nil); code != http.StatusSeeOther {
			t.Fatalf("%s's sign-in: %d", user, code)
		}
		return c
	}
	otto, vera := signIn("otto", "o-pw"), signIn("vera", "v-pw")
	_, page := get(t, otto, n.srv.URL+"/ui/cron")
	if !strings.Contains(page, `action="/ui/cron/nightly/backfill"`) {
		t.Fatalf("an operator's cron page has no backfill form:\n%s", page)
	}
	if _, vpage := get(t, vera, n.srv.URL+"/ui/cron"); strings.Contains(vpage, "/backfill") {
		t.Fatalf("a viewer's cron page has the backfill form")
	}
	from, to := time.Now().AddDate(0, 0, -3).Format("2006-01-02"), time.Now().AddDate(0, 0, -1).Format("2006-01-02")
	form := url.Values{"csrf": {csrfOf(t, page)}, "from": {from}, "to": {to}}
	if code, _ := post(t, vera, n.srv.URL+"/ui/cron/nightly/backfill", url.Values{"csrf": {csrfOf(t, page)}, "from": {from}, "to": {to}}, nil); code == http.StatusSeeOther {
		t.Fatalf("a viewer's backfill was accepted")
	}
	if code, body := post(t, otto, n.srv.URL+"/ui/cron/nightly/backfill", form, nil); code != http.StatusSeeOther {
		t.Fatalf("the backfill: %d %s", code, body)
	}
	runs, _, err := n.e.ListRuns(checkpoint.ListOptions{Workflow: "nightly", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].Trigger != checkpoint.TriggerBackfill {
		t.Fatalf("runs after backfilling %s to %s: %+v", from, to, runs)
	}
}

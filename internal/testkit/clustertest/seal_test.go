package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/client"
)

// Issue 36, item 2: a node's credential sealed the leader bucket; elections failed, and
// after a restart no flowd started at all. With real flowd processes.

// oldNodeUpdatesFlowd is flowd whose node role has back only the update and purge
// rights from before issue 36 (the negative control).
func oldNodeUpdatesFlowd(t *testing.T) string {
	return FlowdLinkedWith(t, "github.com/flowrun/flow/internal/base/natsnode.oldNodeUpdates=1")
}

// readyzOf is the node's /readyz: its status code and body.
func readyzOf(httpAddr string) (int, string) {
	hc := http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get("http://" + httpAddr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A node's credential (nora, on flowd --auth) tries to seal each of flow's eight streams
// and buckets: the server refuses each update, none is sealed, and flowd stays ready
// and runs a workflow. Negative control: on a flowd whose node role has back only the
// update and purge rights from before issue 36, the same update seals the leader
// bucket and the election fails (readyz 503, no leader). Then the repair: the sealed
// flowd says in readyz which bucket and the command, also after a restart (it starts:
// no crash loop); `flowctl cluster repair` as the admin brings it back: readyz 200,
// a leader, and a run completes.
func TestNodeCredentialCannotSealAndRepairMendsIt(t *testing.T) {
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	for _, old := range []bool{false, true} {
		t.Run(map[bool]string{false: "narrowed", true: "control-old-update-rights"}[old], func(t *testing.T) {
			var p *Proc
			var url, httpAddr string
			if old {
				p, url, httpAddr = embeddedFlowdBin(t, oldNodeUpdatesFlowd(t), "--auth", usersFile(t))
			} else {
				p, url, httpAddr = embeddedFlowd(t, "--auth", usersFile(t))
			}
			otto := []string{"--user", "otto", "--password", authPasswords["otto"]}
			ann := []string{"--user", "ann", "--password", authPasswords["ann"]}
			wf := filepath.Join(t.TempDir(), "one.yaml")
			if err := os.WriteFile(wf, []byte(oneStep), 0o600); err != nil {
				t.Fatal(err)
			}
			if code, out := flowctl(url, append(otto, "workflow", "apply", "-f", wf)...); code != 0 {
				t.Fatalf("workflow apply: exit %d: %s", code, out)
			}
			if code, out := flowctl(url, append(otto, "run", "start", "one", "--id", "before", "--wait")...); code != 0 {
				t.Fatalf("a run: exit %d: %s", code, out)
			}
			// FLOW_EVENTS exists once a workflow has a trigger (the leader makes it).
			ev := filepath.Join(t.TempDir(), "ledger.yaml")
			if err := os.WriteFile(ev, []byte(ledgerTrigger), 0o600); err != nil {
				t.Fatal(err)
			}
			if code, out := flowctl(url, append(otto, "workflow", "apply", "-f", ev)...); code != 0 {
				t.Fatalf("workflow apply (a trigger): exit %d: %s", code, out)
			}
			if code, out := flowctl(url, append(otto, "cluster", "snapshot")...); code != 0 { // the object store exists too
				t.Fatalf("cluster snapshot: exit %d: %s", code, out)
			}
			WaitFor(t, 30*time.Second, "readyz 200", func() bool { code, _ := readyzOf(httpAddr); return code == http.StatusOK })

			refused := make(chan error, 64)
			nc, err := nats.Connect(url, nats.UserInfo("nora", authPasswords["nora"]), nats.MaxReconnects(0),
				nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
					if errors.Is(err, nats.ErrPermissionViolation) {
						refused <- err
					}
				}))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			targets := client.FlowStreams()
			if old {
				targets = []string{"KV_FLOW_LEADER"}
			} else {
				WaitFor(t, 60*time.Second, "FLOW_EVENTS made for the trigger", func() bool {
					sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
					defer scancel()
					_, err := js.Stream(sctx, "FLOW_EVENTS")
					return err == nil
				})
			}
			for _, name := range targets {
				st, err := js.Stream(ctx, name)
				if err != nil {
					t.Fatalf("%s: the node's info: %v", name, err)
				}
				cfg := st.CachedInfo().Config
				cfg.Sealed = true
				uctx, ucancel := context.WithTimeout(ctx, 5*time.Second)
				_, err = js.UpdateStream(uctx, cfg)
				ucancel()
				if old {
					if err != nil {
						t.Fatalf("control: the old update rights did not seal %s: %v", name, err)
					}
					continue
				}
				if err == nil {
					t.Fatalf("the node's credential sealed %s", name)
				}
				select {
				case v := <-refused:
					if !strings.Contains(v.Error(), "$JS.API.STREAM.UPDATE."+name) {
						t.Fatalf("%s: refused %v", name, v)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("%s: no permissions violation (the update's error: %v)", name, err)
				}
			}
			for _, name := range targets {
				st, err := js.Stream(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				if sealed := st.CachedInfo().Config.Sealed; sealed != old {
					t.Fatalf("%s sealed: %v", name, sealed)
				}
			}
			if !old {
				if code, out := flowctl(url, append(otto, "run", "start", "one", "--id", "after", "--wait")...); code != 0 {
					t.Fatalf("a run after the node's tries: exit %d: %s", code, out)
				}
				if code, body := readyzOf(httpAddr); code != http.StatusOK {
					t.Fatalf("readyz after the node's tries: %d %s", code, body)
				}
				return
			}

			// The control: the election fails, and flowd says what to do.
			said := func() bool {
				code, body := readyzOf(httpAddr)
				return code == http.StatusServiceUnavailable && strings.Contains(body, "KV_FLOW_LEADER: sealed") &&
					strings.Contains(body, "`flowctl cluster repair`")
			}
			WaitFor(t, 30*time.Second, "readyz to say the leader bucket is sealed and what to run", said)
			// (The sealed bucket keeps the old leader key: it no longer lapses.)
			WaitFor(t, 30*time.Second, "node-a to lead no more, its campaigns refused on the sealed bucket", func() bool {
				code, out := flowctl(url, append(otto, "cluster", "status", "-o", "json")...)
				var st client.ClusterStatus
				return code == 0 && json.Unmarshal([]byte(out), &st) == nil && len(st.Nodes) == 1 && !st.Nodes[0].Leader &&
					strings.Contains(LogOf(p), "campaign failed; retrying") && strings.Contains(LogOf(p), "invalid operation on sealed stream")
			})
			if code, out := flowctl(url, append(otto, "run", "start", "one", "--id", "while-sealed")...); code != 0 {
				t.Fatalf("run start while sealed: exit %d: %s", code, out)
			}
			// A restart: flowd starts (issue 36 saw no flowd start again on a sealed
			// bucket) and says the same.
			p.Kill()
			p.Restart(t)
			WaitFor(t, 60*time.Second, "the restarted flowd to say the leader bucket is sealed", func() bool { return said() || !p.Alive() })
			if !p.Alive() {
				t.Fatalf("flowd did not start on the sealed bucket:\n%s", tail(LogOf(p)))
			}
			if !strings.Contains(LogOf(p), "flowctl cluster repair") {
				t.Fatal("the log does not say what to run")
			}
			// An operator may not repair; the admin may. A dry run changes nothing.
			if code, out := flowctl(url, append(otto, "cluster", "repair")...); code != 4 {
				t.Fatalf("cluster repair as an operator: exit %d: %s; want 4", code, out)
			}
			code, out := flowctl(url, append(ann, "cluster", "repair", "--dry-run")...)
			if code != 0 || !strings.Contains(out, "KV_FLOW_LEADER") || !strings.Contains(out, "dry run") {
				t.Fatalf("cluster repair --dry-run: exit %d: %s", code, out)
			}
			if !said() {
				t.Fatal("the dry run changed something")
			}
			code, out = flowctl(url, append(otto, "run", "get", "while-sealed", "-o", "json")...)
			var r client.Run
			if code != 0 || json.Unmarshal([]byte(out), &r) != nil || r.Status == "succeeded" {
				t.Fatalf("the run started while sealed, before the repair: exit %d: %s; want it not done (no leader assigns it)", code, out)
			}
			code, out = flowctl(url, append(ann, "cluster", "repair")...)
			if code != 0 || !strings.Contains(out, "recreate") {
				t.Fatalf("cluster repair: exit %d: %s", code, out)
			}
			t.Logf("cluster repair:\n%s", out)
			WaitFor(t, 60*time.Second, "readyz 200 after the repair", func() bool { code, _ := readyzOf(httpAddr); return code == http.StatusOK })
			if code, out := flowctl(url, append(otto, "run", "start", "one", "--id", "after-repair", "--wait")...); code != 0 {
				t.Fatalf("a run after the repair: exit %d: %s", code, out)
			}
			if code, out := flowctl(url, append(otto, "run", "watch", "while-sealed")...); code != 0 {
				t.Fatalf("the run started while sealed, after the repair: exit %d: %s", code, out)
			}
		})
	}
}

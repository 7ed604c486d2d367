// Package dockertest tries the container image and deploy/compose.yaml with Docker, as
// an operator would: .ci/run runs it with FLOW_DOCKER_TESTS=1 (the README's test command
// skips it: it builds an image and starts nine containers). For tests only.
package dockertest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/testkit/clustertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// compose runs docker-compose on the test's project.
type compose struct {
	t       *testing.T
	root    string
	project string
	env     []string
}

func (c *compose) run(args ...string) (string, error) {
	c.t.Helper()
	cmd := exec.Command("docker-compose", append([]string{"-p", c.project, "-f", filepath.Join(c.root, "deploy", "compose.yaml")}, args...)...)
	cmd.Env = append(os.Environ(), c.env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		return "", err
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return out.String(), fmt.Errorf("docker-compose %s: %v: %s", strings.Join(args, " "), err, errOut.String())
		}
		return out.String(), nil
	case <-time.After(5 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		return "", fmt.Errorf("docker-compose %s: no answer in 5 minutes", strings.Join(args, " "))
	}
}

func (c *compose) must(args ...string) string {
	c.t.Helper()
	out, err := c.run(args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// flowctl runs flowctl in a container on the cluster's network as the operator "ops".
func (c *compose) flowctl(args ...string) (string, error) {
	return c.run(append([]string{"--profile", "tools", "run", "--rm", "-T", "flowctl"}, args...)...)
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
}

// The compose cluster (issue 29): the image built with deploy/build-image.sh (nothing
// pulled), the configuration with deploy/setup.sh (TLS, users and permissions), three
// NATS servers and three flow nodes started by deploy/compose.yaml. The payout runs
// through it while the run's owner container is SIGKILLed and one NATS container is
// stopped: every driver is paid once (the wallet's ledger equals the computed payout).
// Then a flow node is cut from the network (docker network disconnect) while it owns a
// run: the run is taken over and paid once, and the node, reconnected, comes back whole.
func TestComposeCluster(t *testing.T) {
	if os.Getenv("FLOW_DOCKER_TESTS") != "1" {
		t.Skip("FLOW_DOCKER_TESTS=1 runs it (.ci/run does): it builds an image and starts containers")
	}
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	tag := "flow:test"
	build := exec.Command("sh", filepath.Join(root, "deploy", "build-image.sh"), tag)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build-image.sh: %v\n%s", err, out)
	}
	conf := t.TempDir()
	setup := exec.Command("sh", filepath.Join(root, "deploy", "setup.sh"), conf)
	if os.Geteuid() != 0 { // its files must belong to the containers' user
		setup = exec.Command("sudo", "-n", "sh", filepath.Join(root, "deploy", "setup.sh"), conf)
	}
	if out, err := setup.CombinedOutput(); err != nil {
		t.Fatalf("setup.sh: %v\n%s", err, out)
	}
	walletPort := freePort(t)
	c := &compose{t: t, root: root, project: fmt.Sprintf("flowtest%d", os.Getpid()), env: []string{
		"FLOW_IMAGE=" + tag, "FLOW_CONFIG_DIR=" + conf, "FLOW_LEASE_TTL=2s", "FLOW_WALLET_LATENCY=40ms", "FLOW_WALLET_PORT=" + walletPort,
		"FLOW_UI_PORT_1=" + freePort(t), "FLOW_UI_PORT_2=" + freePort(t), "FLOW_UI_PORT_3=" + freePort(t)}}
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := c.run("logs", "--tail", "40")
			t.Logf("logs:\n%s", logs)
		}
		_, _ = c.run("down", "-v", "--remove-orphans")
	})
	c.must("up", "-d")
	status := func() client.ClusterStatus {
		var st client.ClusterStatus
		out, err := c.flowctl("cluster", "status", "-o", "json")
		if err == nil {
			_ = json.Unmarshal([]byte(out), &st)
		}
		return st
	}
	clustertest.WaitFor(t, 3*time.Minute, "three flow nodes and a leader", func() bool {
		st := status()
		return st.Leader != "" && len(st.Nodes) == 3 && st.ClusterVersion == 2
	})
	c.must("--profile", "tools", "run", "--rm", "-T", "flowctl", "workflow", "apply", "-f", "/usr/share/flow/payout.yaml")

	// The payout, with its owner killed and a NATS server stopped during the transfer.
	pay := func(date string) (client.Run, string) {
		out, err := c.flowctl("run", "start", "nightly-payout", "-o", "json", "--input", "wallet=http://wallet:9090", "--input", "drivers=2000",
			"--input", "approval_above=999999999999", "--input", "date="+date)
		if err != nil {
			t.Fatal(err)
		}
		var started struct{ ID string }
		if json.Unmarshal([]byte(out), &started) != nil || started.ID == "" {
			t.Fatalf("run start: %s", out)
		}
		var r client.Run
		clustertest.WaitFor(t, 2*time.Minute, "the transfer under way", func() bool {
			out, err := c.flowctl("run", "get", started.ID, "-o", "json")
			if err != nil || json.Unmarshal([]byte(out), &r) != nil || r.Owner == "" {
				return false
			}
			for _, s := range r.Steps {
				if s.Name == "transfer" && s.Status == "running" {
					return true
				}
			}
			return false
		})
		return r, started.ID
	}
	finished := func(id string) client.Run {
		var r client.Run
		clustertest.WaitFor(t, 4*time.Minute, "run "+id+" to end", func() bool {
			out, err := c.flowctl("run", "get", id, "-o", "json")
			return err == nil && json.Unmarshal([]byte(out), &r) == nil && (r.Status == "succeeded" || r.Status == "failed" || r.Status == "dead_lettered")
		})
		if r.Status != "succeeded" {
			t.Fatalf("run %s ended %s: %s", id, r.Status, r.Error)
		}
		return r
	}
	paidOnce := func(r client.Run, date string) {
		var computed struct {
			Count      int   `json:"count"`
			TotalCents int64 `json:"total_cents"`
		}
		for _, s := range r.Steps {
			if s.Name == "compute" {
				_ = json.Unmarshal(s.Output, &computed)
			}
		}
		resp, err := http.Get("http://127.0.0.1:" + walletPort + "/ledger?date=" + date)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var ledger struct {
			Drivers    int   `json:"drivers"`
			TotalCents int64 `json:"total_cents"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&ledger); err != nil {
			t.Fatal(err)
		}
		if computed.Count == 0 || ledger.Drivers != computed.Count || ledger.TotalCents != computed.TotalCents {
			t.Fatalf("%s: the wallet paid %d drivers %d cents; the payout computed %d drivers %d cents", date, ledger.Drivers, ledger.TotalCents, computed.Count, computed.TotalCents)
		}
	}
	r, id := pay("2026-11-27")
	owner := r.Owner
	c.must("kill", "-s", "SIGKILL", owner)
	c.must("stop", "-t", "1", "nats-2")
	r = finished(id)
	paidOnce(r, "2026-11-27")
	t.Logf("payout %s: owner %s SIGKILLed and nats-2 stopped mid-transfer; every driver paid once (epochs %v)", id, owner, r.Epochs)
	c.must("start", "nats-2")
	c.must("start", owner)
	clustertest.WaitFor(t, 3*time.Minute, "three flow nodes again", func() bool { return len(status().Nodes) == 3 })

	// A partition: the owner cut from the network while it owns the run.
	r, id = pay("2026-11-26")
	owner = r.Owner
	cid := strings.TrimSpace(c.must("ps", "-q", owner))
	network := c.project + "_default"
	if out, err := exec.Command("docker", "network", "disconnect", network, cid).CombinedOutput(); err != nil {
		t.Fatalf("disconnect %s: %v %s", owner, err, out)
	}
	r = finished(id)
	paidOnce(r, "2026-11-26")
	if out, err := exec.Command("docker", "network", "connect", network, cid, "--alias", owner).CombinedOutput(); err != nil {
		t.Fatalf("connect %s: %v %s", owner, err, out)
	}
	// The cut node gave the run up on its own (its lease's keeper, or the epoch's
	// write, said so): it did not go on as if it still owned the run.
	logs := c.must("logs", "--no-color", owner)
	if !strings.Contains(logs, "ownership lost") && !strings.Contains(logs, "lock-stolen-mid-run") && !strings.Contains(logs, "renewal failed") {
		t.Fatalf("%s's log does not show it giving up its run when cut off:\n%s", owner, logs[max(0, len(logs)-4000):])
	}
	// Nothing the cut node wrote after it lost its lease was taken: every step committed
	// once, in the epoch that ran it (run verify).
	if out, err := c.flowctl("run", "verify", id, "-o", "json"); err != nil || !strings.Contains(out, `"ok": true`) {
		t.Fatalf("run verify %s: %v %s", id, err, out)
	}
	clustertest.WaitFor(t, 3*time.Minute, owner+" back and caught up", func() bool {
		st := status()
		for _, n := range st.Nodes {
			if n.ID == owner && n.Applied >= st.LastSeq-5 && len(n.Problems) == 0 {
				return true
			}
		}
		return false
	})
	t.Logf("payout %s: owner %s cut from the network mid-transfer; paid once, and %s came back whole", id, owner, owner)
}

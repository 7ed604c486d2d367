package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/flowrun/flow/client"
)

// chaosCluster is three payout nodes (child processes running `payout node`, that is
// flowd with the payout's step kinds) on one NATS server embedded in this process, so
// that pausing or killing a node never takes the log down with it.
type chaosCluster struct {
	o       options
	dir     string
	nats    *natsserver.Server
	natsURL string
	nc      *nats.Conn
	client  *client.Client
	nodes   []*chaosNode
	rounds  int // disruptions done, to rotate which node is killed
	stolen  int // lock-stolen-mid-run lines already reported
}

// chaosNode is one child process.
type chaosNode struct {
	id      string
	args    []string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	paused  bool
}

func (n *chaosNode) start() error {
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(n.args[0], n.args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("chaos: start %s: %w", n.id, err)
	}
	n.cmd, n.done, n.paused = cmd, make(chan struct{}), false
	go func(done chan struct{}) { _ = cmd.Wait(); logf.Close(); close(done) }(n.done)
	return nil
}

func (n *chaosNode) signal(s syscall.Signal) { _ = n.cmd.Process.Signal(s) }

// kill SIGKILLs the node and waits for it to be gone.
func (n *chaosNode) kill() {
	n.signal(syscall.SIGKILL)
	<-n.done
}

// pause and resume are SIGSTOP and SIGCONT.
func (n *chaosNode) pause()  { n.signal(syscall.SIGSTOP); n.paused = true }
func (n *chaosNode) resume() { n.signal(syscall.SIGCONT); n.paused = false }

// stop lets a node drain (SIGTERM), or kills it if it does not within d.
func (n *chaosNode) stop(d time.Duration) {
	if n.paused {
		n.resume()
	}
	n.signal(syscall.SIGTERM)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-n.done:
	case <-t.C:
		n.kill()
	}
}

func startChaosCluster(ctx context.Context, o options) (c *chaosCluster, err error) {
	bin := o.nodeBin
	if bin == "" {
		if bin, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("chaos: find this program to start its nodes: %w", err)
		}
	}
	c = &chaosCluster{o: o, dir: filepath.Join(o.dataDir, "chaos")}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	if c.nats, err = startNATS(filepath.Join(c.dir, "nats")); err != nil {
		return c, err
	}
	c.natsURL = c.nats.ClientURL()
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("node-%d", i)
		n := &chaosNode{id: id, logPath: filepath.Join(c.dir, id+".log"), args: []string{bin, "node",
			"--node-id", id, "--nats-url", c.natsURL, "--data-dir", filepath.Join(c.dir, id), "--http", "off",
			"--lease-ttl", o.leaseTTL.String(), "--workers", "4", "--log-format", "json"}}
		if err = n.start(); err != nil {
			return c, err
		}
		c.nodes = append(c.nodes, n)
	}
	c.lockStolen() // a reused --data-dir: count only what this run's nodes log
	if c.nc, err = nats.Connect(c.natsURL, nats.Name("payout-chaos")); err != nil {
		return c, err
	}
	ready := client.New(c.nc)
	// Ready when every node answers and one of them leads.
	err = waitFor(ctx, time.Minute, "three nodes and a leader", func() (bool, error) {
		for _, n := range c.nodes {
			select {
			case <-n.done:
				return false, fmt.Errorf("chaos: node %s exited at start; its log: %s", n.id, n.logPath)
			default:
			}
		}
		st, err := ready.ClusterStatus(ctx)
		if err != nil {
			return false, nil
		}
		return len(st.Nodes) == 3 && st.Leader != "", nil
	})
	// A paused node gets its share of the requests and never answers them: try another
	// soon (run.get answers in milliseconds; cluster.status, which gathers the nodes for
	// 300ms, is not called from here on) so that the demo sees the run move in time.
	c.client = client.New(c.nc, client.WithAttemptTimeout(300*time.Millisecond))
	return c, err
}

func (c *chaosCluster) node(id string) *chaosNode {
	for _, n := range c.nodes {
		if n.id == id {
			return n
		}
	}
	return nil
}

// disrupt does, during the transfer of run id: (1) SIGSTOP the run's owner and keep it
// stopped until the run has moved to a new epoch (so past its lease TTL), SIGKILL another
// node meanwhile and restart it, then SIGCONT the owner, a zombie now; (2) once the new
// owner has paid some more drivers, SIGKILL it and restart it. It writes what it did
// into r.Disruption.
func (c *chaosCluster) disrupt(ctx context.Context, id string, r *round) error {
	var v client.Run
	transfer := func(v client.Run) client.Step {
		for _, s := range v.Steps {
			if s.Name == "transfer" {
				return s
			}
		}
		return client.Step{}
	}
	err := waitFor(ctx, 2*time.Minute, "the transfer to start", func() (bool, error) {
		var err error
		v, err = getRun(ctx, c.client, id)
		st := transfer(v)
		return terminal(v.Status) || st.Items > 0 && st.ItemsDone >= max(1, st.Items/10), err
	})
	if err != nil {
		return err
	}
	if terminal(v.Status) {
		return fmt.Errorf("chaos: run %s finished before its transfer could be disrupted: use more --drivers or a longer --wallet-latency", id)
	}
	owner := c.node(v.Owner)
	if owner == nil {
		return fmt.Errorf("chaos: run %s is owned by %q, not one of the chaos nodes", id, v.Owner)
	}
	var victim *chaosNode
	for i := range c.nodes {
		if n := c.nodes[(c.rounds+i)%len(c.nodes)]; n != owner {
			victim = n
			break
		}
	}
	c.rounds++
	oldEpoch, at := v.Epoch, transfer(v).ItemsDone
	pausedAt := time.Now()
	owner.pause()
	victim.kill()
	if err := victim.start(); err != nil {
		owner.resume()
		return err
	}
	err = waitFor(ctx, 2*time.Minute, "the run to move to a new epoch", func() (bool, error) {
		var err error
		v, err = getRun(ctx, c.client, id)
		return v.Epoch != oldEpoch || terminal(v.Status), err
	})
	paused := time.Since(pausedAt)
	owner.resume()
	if err != nil {
		return err
	}
	// The new epoch's owner may not be known yet: the task can sit with the paused node's
	// pending pull until its ack wait passes; the epoch list shows who took it.
	r.Disruption = fmt.Sprintf("paused %s (owner, epoch %d) at %d/%d credits for %.1fs, until its lease lapsed (TTL %s after its last renewal) and epoch %d took the run over; meanwhile killed %s and restarted it",
		owner.id, oldEpoch, at, transfer(v).Items, paused.Seconds(), c.o.leaseTTL, v.Epoch, victim.id)

	// (2) Kill the new owner once it has paid 5% more, if the transfer still runs then.
	from := transfer(v).ItemsDone
	err = waitFor(ctx, 2*time.Minute, "the new owner to pay more drivers", func() (bool, error) {
		var err error
		v, err = getRun(ctx, c.client, id)
		st := transfer(v)
		return terminal(v.Status) || st.Status != "running" || st.ItemsDone >= from+max(1, st.Items/20), err
	})
	if err != nil {
		return err
	}
	if st := transfer(v); !terminal(v.Status) && st.Status == "running" && st.ItemsDone < st.Items {
		if n := c.node(v.Owner); n != nil {
			n.kill()
			if err := n.start(); err != nil {
				return err
			}
			r.Disruption += fmt.Sprintf("; killed %s (owner, epoch %d) at %d/%d credits and restarted it", n.id, v.Epoch, st.ItemsDone, st.Items)
		}
	}
	return nil
}

// lockStolen counts the lock-stolen-mid-run lines the nodes logged since the last call.
func (c *chaosCluster) lockStolen() int {
	total := 0
	for _, n := range c.nodes {
		b, _ := os.ReadFile(n.logPath)
		total += strings.Count(string(b), "lock-stolen-mid-run")
	}
	d := total - c.stolen
	c.stolen = total
	return d
}

func (c *chaosCluster) stop() {
	for _, n := range c.nodes {
		n.stop(15 * time.Second)
	}
	if c.nc != nil {
		c.nc.Close()
	}
	if c.nats != nil {
		c.nats.Shutdown()
		c.nats.WaitForShutdown()
	}
}

// waitFor polls cond until it holds, fails, or d passes.
func waitFor(ctx context.Context, d time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(d)
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("chaos: waiting for %s: %w", what, err)
			}
			return fmt.Errorf("chaos: %s did not happen within %s", what, d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond): // polling other processes' state
		}
	}
}

// startNATS starts the NATS JetStream server the chaos nodes share, in this process, on
// a free loopback port, fsyncing every write as flowd's embedded server does (a node
// killed mid-run must find every acknowledged entry), with bounded storage.
func startNATS(dir string) (*natsserver.Server, error) {
	srv, err := natsserver.NewServer(&natsserver.Options{
		ServerName: "payout-chaos", Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, NoSigs: true,
		JetStream: true, StoreDir: dir, SyncAlways: true,
		JetStreamMaxStore: 1 << 30, JetStreamMaxMemory: 64 << 20, MaxPayload: 8 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("chaos: NATS server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("chaos: the NATS server did not start within 10s")
	}
	return srv, nil
}

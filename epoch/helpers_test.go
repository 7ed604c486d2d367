package epoch

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/flowrun/flow/internal/base/jsport"
	"github.com/flowrun/flow/internal/base/natsnode"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		helperMain()
		return
	}
	goleak.VerifyTestMain(m)
}

const testTTL = time.Second

func testConfig() Config {
	return Config{TTL: testTTL, Backoff: fastBackoff}
}

// startNATS starts an embedded server listening on a free loopback port.
func startNATS(t testing.TB) *natsnode.Server {
	t.Helper()
	srv, err := natsnode.Start(natsnode.Config{DataDir: filepath.Join(t.TempDir(), "nats"), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

func connect(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := natsnode.Connect(url, "test", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds or the deadline passes: a condition with a
// deadline, not a sleep.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// proxy is a loopback TCP proxy that can black-hole traffic: a network partition
// between a holder and NATS without closing the connection.
type proxy struct {
	gateMu  sync.Mutex
	gate    chan struct{} // closed while traffic flows; held traffic waits on it
	ln      net.Listener
	target  string
	dropped atomic.Bool
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, gate: make(chan struct{})}
	close(p.gate)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, u)
		go p.pipe(u, c)
	}
}

// pipe copies src to dst, discarding everything while the proxy drops traffic.
func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.gateMu.Lock()
		gate := p.gate
		p.gateMu.Unlock()
		<-gate
		if n > 0 && !p.dropped.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}

// hold delays all traffic (without losing any) until release.
func (p *proxy) hold() {
	p.gateMu.Lock()
	p.gate = make(chan struct{})
	p.gateMu.Unlock()
}

func (p *proxy) release() {
	p.gateMu.Lock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
	p.gateMu.Unlock()
}

func (p *proxy) close() {
	p.release()
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// recvEvent takes the next lease event within d, or fails the test naming what it
// waited for.
func recvEvent(t testing.TB, events <-chan LeaseEvent, d time.Duration, what string) LeaseEvent {
	t.Helper()
	select {
	case ev := <-events:
		return ev
	case <-time.After(d):
		t.Fatalf("no lease event within %s: waiting for %s", d, what)
		return LeaseEvent{}
	}
}

// newLeases opens the lease bucket for cfg's TTL on js and takes leases in it, as the
// engine does (jsport.Open).
func newLeases(ctx context.Context, js jetstream.JetStream, cfg Config, replicas int) (*Leases, error) {
	ready, err := cfg.ready()
	if err != nil {
		return nil, err
	}
	kv, err := jsport.OpenKV(ctx, js, jsport.LeasesConfig(ready.TTL, replicas), nil)
	if err != nil {
		return nil, err
	}
	return NewLeases(kv, cfg)
}

// newElector opens the leader bucket for cfg's TTL on js and campaigns in it; its terms
// are raised through js.
func newElector(ctx context.Context, js jetstream.JetStream, node string, cfg Config, replicas int) (*Elector, error) {
	ready, err := cfg.ready()
	if err != nil {
		return nil, err
	}
	kv, err := jsport.OpenKV(ctx, js, jsport.LeaderConfig(ready.TTL, replicas), nil)
	if err != nil {
		return nil, err
	}
	return NewElector(kv, raiseIn{js}, node, cfg)
}

type raiseIn struct{ js jetstream.JetStream }

func (r raiseIn) RaiseTerms(ctx context.Context, above int64) error {
	return jsport.RaiseTerms(ctx, r.js, above)
}

// latestOf reads key of bucket through the stream leader.
func latestOf(ctx context.Context, js jetstream.JetStream, bucket, key string) (latest, error) {
	return readLatest(ctx, jsport.KVNamed(js, bucket), key)
}

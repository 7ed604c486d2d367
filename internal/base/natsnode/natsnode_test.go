package natsnode

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/flowrun/flow/internal/base/jsport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBadConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "DataDir is empty"},
		{Config{DataDir: t.TempDir(), Listen: "nonsense"}, "want HOST:PORT"},
		{Config{DataDir: t.TempDir(), Listen: "127.0.0.1:99999"}, "port"},
		{Config{DataDir: t.TempDir(), Cluster: ClusterConfig{Listen: "127.0.0.1:0"}}, "a cluster needs a client listener"},
	} {
		_, err := Start(c.cfg)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Start(%+v) = %v; want ErrInvalidConfig mentioning %q", c.cfg, err, c.want)
		}
	}
}

// A stream written through the in-process server survives a restart on the same dir,
// and a listener on port 0 gets a free port that a TCP client can reach.
func TestRestartKeepsStreamsAndListens(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv, err := Start(Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if srv.ClientURL() != "" {
		t.Fatalf("in-process server has a client URL %q", srv.ClientURL())
	}
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	srv.Shutdown()
	srv.Shutdown() // twice is fine

	srv, err = Start(Config{DataDir: dir, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	if !strings.HasPrefix(srv.ClientURL(), "nats://127.0.0.1:") || strings.HasSuffix(srv.ClientURL(), ":4222") {
		t.Fatalf("client URL %q: want a free port on 127.0.0.1", srv.ClientURL())
	}
	nc, err = Connect(srv.ClientURL(), "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ = jetstream.New(nc)
	s, err := js.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(ctx, 1)
	if err != nil || string(m.Data) != "kept" {
		t.Fatalf("after restart: %v %v", m, err)
	}
	if jsport.Replicas(nc) != 1 {
		t.Fatalf("a single server wants 1 replica, got %d", jsport.Replicas(nc))
	}
	if _, err := Connect("nats://127.0.0.1:1", "test", nats.MaxReconnects(0), nats.RetryOnFailedConnect(false)); err == nil || !strings.Contains(err.Error(), "is NATS running") {
		t.Fatalf("connect to nothing: %v", err)
	}
}

// ServerSyncPolicy reads the server's own answer when the connection may ask (a system
// account user), and says SyncUnknown when it may not (a stock server's default user).
func TestServerSyncPolicy(t *testing.T) {
	for _, synced := range []bool{true, false} {
		sys := server.NewAccount("SYS")
		opts := &server.Options{
			JetStream: true, StoreDir: t.TempDir(), SyncAlways: synced, Host: "127.0.0.1", Port: server.RANDOM_PORT,
			NoSigs: true, NoLog: true, Accounts: []*server.Account{sys}, SystemAccount: "SYS",
			Users: []*server.User{{Username: "sys", Password: "sys-pass", Account: sys}, {Username: "app", Password: "app-pass"}},
		}
		srv, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go srv.Start()
		if !srv.ReadyForConnections(10 * time.Second) {
			t.Fatal("server not ready")
		}
		want := jsport.SyncPeriodic
		if synced {
			want = jsport.SyncEveryWrite
		}
		for user, expect := range map[string]jsport.SyncPolicy{"sys": want, "app": jsport.SyncUnknown} {
			nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, user+"-pass"))
			if err != nil {
				t.Fatal(err)
			}
			if got := jsport.ServerSyncPolicy(nc, 2*time.Second); got != expect {
				t.Errorf("SyncAlways=%v, user %s: policy %d, want %d", synced, user, got, expect)
			}
			nc.Close()
		}
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

package natsnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/testkit/testcerts"
)

// withOld gives the users of the servers the test starts one part of the permissions
// from before per-user inboxes and the narrowed node role (oldInboxes or oldNodeRole):
// each negative control switches off its guard alone.
func withOld(t *testing.T, v *string) {
	*v = "1"
	t.Cleanup(func() { *v = "" })
}

// A person reads only the answers to their own requests: a viewer's subscriptions to
// every inbox, to an operator's inbox and to everything are refused by the server, and
// the operator's answer reaches the operator alone. Negative control: with the
// permissions from before issue 24 (every person may read "_INBOX.>", where every
// client's answers came), the viewer reads the operator's answer.
func TestAnswersReachOnlyTheirUser(t *testing.T) {
	for _, old := range []bool{false, true} {
		t.Run(map[bool]string{false: "own-inboxes", true: "control-old-inboxes"}[old], func(t *testing.T) {
			if old {
				withOld(t, &oldInboxes)
			}
			s := startAuth(t, User{Name: "vera", Password: "v-secret", Role: "viewer"}, User{Name: "otto", Password: "o-secret", Role: "operator"})
			own, err := s.Connect()
			if err != nil {
				t.Fatal(err)
			}
			defer own.Close()
			// The API's responder: what it answers is the operator's business.
			if _, err := own.Subscribe("flow.v1.>", func(m *nats.Msg) { _ = m.Respond([]byte("otto's new run: payroll-7")) }); err != nil {
				t.Fatal(err)
			}
			_ = own.Flush()

			inbox := inboxOf("otto")
			if old {
				inbox = nats.CustomInboxPrefix("_INBOX") // the client before issue 24
			}
			otto, _ := connectAs(t, s, nats.UserInfo("otto", "o-secret"), inbox)
			vera, veraErrs := connectAs(t, s, nats.UserInfo("vera", "v-secret"), inboxOf("vera"))
			eavesdrop := []string{"_INBOX.>", client.InboxPrefix("otto") + ".>", ">"}
			if old {
				eavesdrop = eavesdrop[:1]
			}
			var subs []*nats.Subscription
			for _, subject := range eavesdrop {
				sub, err := vera.SubscribeSync(subject)
				if err != nil {
					t.Fatal(err)
				}
				subs = append(subs, sub)
			}
			if err := vera.Flush(); err != nil {
				t.Fatal(err)
			}
			if !old {
				for _, subject := range eavesdrop {
					violation(t, veraErrs, subject)
				}
			}
			m, err := otto.Request("flow.v1.run.start", []byte("{}"), 10*time.Second)
			if err != nil || string(m.Data) != "otto's new run: payroll-7" {
				t.Fatalf("the operator's own answer: %v", err)
			}
			// The server queued any copy for the viewer before the operator got his: a
			// round trip of the viewer's connection brings it in.
			if err := vera.Flush(); err != nil {
				t.Fatal(err)
			}
			read := 0
			for _, sub := range subs {
				n, _, _ := sub.Pending()
				read += n
			}
			switch {
			case !old && read != 0:
				t.Fatalf("the viewer read %d of the operator's answers", read)
			case old && read == 0:
				t.Fatal("control: with the old permissions the viewer read nothing: the test shows nothing")
			case old:
				m, _ := subs[0].NextMsg(time.Second) // already pending
				t.Logf("control: the viewer read %q on %s", m.Data, m.Subject)
			}
		})
	}
}

// The node role does what flowd does to flow's streams and no more: it may write the log
// and purge it (compaction), but not delete the log or a bucket, change the log's
// configuration, delete a message, or call the API. Negative control: with the node role
// from before issue 24 (">"), the same user deletes the log and the leases bucket.
func TestNodeRoleCannotDeleteFlowsStreams(t *testing.T) {
	for _, old := range []bool{false, true} {
		t.Run(map[bool]string{false: "narrowed", true: "control-old-node-role"}[old], func(t *testing.T) {
			if old {
				withOld(t, &oldNodeRole)
			}
			s := startAuth(t, User{Name: "nora", Password: "n-secret", Role: "node"})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			own, err := s.Connect()
			if err != nil {
				t.Fatal(err)
			}
			defer own.Close()
			js, _ := jetstream.New(own)
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FLOW_LOG", Subjects: []string{"flow.log"}}); err != nil {
				t.Fatal(err)
			}
			if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "FLOW_LEASES"}); err != nil {
				t.Fatal(err)
			}
			node, nodeErrs := connectAs(t, s, nats.UserInfo("nora", "n-secret"))
			njs, _ := jetstream.New(node)
			if old {
				if err := njs.DeleteStream(ctx, "FLOW_LOG"); err != nil {
					t.Fatalf("control: the old node role could not delete the log: %v", err)
				}
				if err := njs.DeleteKeyValue(ctx, "FLOW_LEASES"); err != nil {
					t.Fatalf("control: the old node role could not delete the leases: %v", err)
				}
				if _, err := js.Stream(ctx, "FLOW_LOG"); !errors.Is(err, jetstream.ErrStreamNotFound) {
					t.Fatalf("control: the log after its delete: %v", err)
				}
				return
			}
			// What a node does: append to the log, purge it below a sequence.
			for range 3 {
				if _, err := njs.Publish(ctx, "flow.log", []byte("entry")); err != nil {
					t.Fatalf("a node's append: %v", err)
				}
			}
			st, err := njs.Stream(ctx, "FLOW_LOG")
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Purge(ctx, jetstream.WithPurgeSequence(3)); err != nil {
				t.Fatalf("a node's compaction: %v", err)
			}
			// What it may not.
			for _, subject := range []string{
				"$JS.API.STREAM.DELETE.FLOW_LOG", "$JS.API.STREAM.DELETE.KV_FLOW_LEASES",
				"$JS.API.STREAM.UPDATE.FLOW_LOG", "$JS.API.STREAM.MSG.DELETE.FLOW_LOG",
				"$JS.API.STREAM.CREATE.SOMEONE_ELSES", "flow.v1.run.cancel",
			} {
				if err := node.Publish(subject, []byte("{}")); err != nil {
					t.Fatal(err)
				}
				violation(t, nodeErrs, subject)
			}
			info, err := js.Stream(ctx, "FLOW_LOG")
			if err != nil || info.CachedInfo().State.Msgs != 1 || info.CachedInfo().State.FirstSeq != 3 {
				t.Fatalf("the log after the node's tries: %+v %v", info.CachedInfo(), err)
			}
			if _, err := js.KeyValue(ctx, "FLOW_LEASES"); err != nil {
				t.Fatalf("the leases after the node's tries: %v", err)
			}
		})
	}
}

// With a certificate, the client port speaks TLS only; with a CA too, it takes only
// clients with a certificate that CA signed. flowd's own connection, in process, works
// either way.
func TestTLSOnTheClientPort(t *testing.T) {
	certs, err := testcerts.Make(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, mutual := range []bool{false, true} {
		t.Run(fmt.Sprintf("mutual=%v", mutual), func(t *testing.T) {
			files := TLSFiles{CertFile: certs.ServerCert, KeyFile: certs.ServerKey}
			if mutual {
				files.CAFile = certs.CA
			}
			s, err := Start(Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", NoSync: true, TLS: files,
				Auth: true, Users: []User{{Name: "vera", Password: "v-secret", Role: "viewer"}}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Shutdown()
			url := s.ClientURL()
			own, err := s.Connect()
			if err != nil {
				t.Fatalf("in process: %v", err)
			}
			own.Close()
			plain := "nats://" + url[len("tls://"):]
			if nc, err := nats.Connect(plain, nats.UserInfo("vera", "v-secret"), nats.MaxReconnects(0)); err == nil {
				nc.Close()
				t.Fatal("a plaintext client was accepted")
			}
			if nc, err := nats.Connect(url, nats.RootCAs(certs.OtherCA), nats.UserInfo("vera", "v-secret"), nats.MaxReconnects(0)); err == nil {
				nc.Close()
				t.Fatal("a client that does not trust the server's CA connected")
			}
			withoutCert, err := nats.Connect(url, nats.RootCAs(certs.CA), nats.UserInfo("vera", "v-secret"), nats.MaxReconnects(0))
			if err == nil {
				withoutCert.Close()
			}
			if mutual == (err == nil) {
				t.Fatalf("a client without a certificate: %v", err)
			}
			nc, err := nats.Connect(url, nats.RootCAs(certs.CA), nats.ClientCert(certs.ClientCert, certs.ClientKey), nats.UserInfo("vera", "v-secret"), nats.MaxReconnects(0))
			if err != nil {
				t.Fatalf("a client with the CA and a certificate: %v", err)
			}
			nc.Close()
		})
	}
	for _, bad := range []Config{
		{DataDir: t.TempDir(), Listen: "127.0.0.1:0", TLS: TLSFiles{CAFile: certs.CA}},
		{DataDir: t.TempDir(), TLS: TLSFiles{CertFile: certs.ServerCert, KeyFile: certs.ServerKey}},
		{DataDir: t.TempDir(), Listen: "127.0.0.1:0", TLS: TLSFiles{CertFile: certs.ServerCert, KeyFile: certs.CA}},
	} {
		if _, err := Start(bad); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Start(%+v) = %v; want ErrInvalidConfig", bad.TLS, err)
		}
	}
}

// Two users whose inboxes would be one (a user named as another's nkey) are refused: one
// would read the other's answers. Names that only look alike are not one inbox.
func TestSameInboxIsRefused(t *testing.T) {
	s, err := Start(Config{DataDir: t.TempDir(), Auth: true, Users: []User{
		{Name: "ann.smith", Password: "a-1", Role: "viewer"}, {Name: "ann_2Esmith", Password: "a-2", Role: "viewer"},
	}})
	if err != nil {
		t.Fatalf("distinct inboxes refused: %v", err)
	}
	s.Shutdown()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	_, err = Start(Config{DataDir: t.TempDir(), Auth: true, Users: []User{
		{NKey: pub, Role: "viewer"}, {Name: pub, Password: "a-2", Role: "operator"},
	}})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "would read the answers of user 1") || strings.Contains(err.Error(), "a-2") {
		t.Fatalf("two users with one inbox: %v", err)
	}
}

// withOldNodeUpdates gives the node role back only its update and purge rights from
// before issue 36 (the negative control of TestNodeRoleCannotSealFlowsStreams).
func withOldNodeUpdates(t *testing.T) {
	oldNodeUpdates = "1"
	t.Cleanup(func() { oldNodeUpdates = "" })
}

// createFlowStreams creates, through js, each of flow's streams and buckets with the
// names, subjects and kinds flow gives them.
func createFlowStreams(t *testing.T, ctx context.Context, js jetstream.JetStream) {
	t.Helper()
	for _, cfg := range []jetstream.StreamConfig{
		{Name: "FLOW_LOG", Subjects: []string{"flow.log"}},
		{Name: "FLOW_TASKS", Subjects: []string{"flow.tasks"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage},
		{Name: "FLOW_DLQ", Subjects: []string{"flow.dlq.>"}},
		{Name: "FLOW_STEPLOGS", Subjects: []string{"flow.steplogs.>"}},
		{Name: "FLOW_EVENTS", Subjects: []string{"ledger.closed.>"}}, // the triggers' (made once a workflow has one)
	} {
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range []string{"FLOW_LEADER", "FLOW_LEASES", "FLOW_NODES", "FLOW_CLUSTER", "FLOW_RATES"} {
		if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b, History: 1, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "FLOW_SNAPSHOTS"}); err != nil {
		t.Fatal(err)
	}
}

// A node's credential cannot seal, reconfigure or purge any of flow's streams and
// buckets (issue 36: `$JS.API.STREAM.UPDATE.KV_FLOW_LEADER` with sealed: true was
// accepted, and no election could be won again, not even after a restart). For each
// of the eleven, the node's sealing update and a change of its limits are refused and
// the stream stays unsealed; a purge is refused on all but the ones it needs
// (client.NodePurges). Negative control: with only the update and purge rights from
// before issue 36 given back, the same update seals the leader bucket and the first
// step of an election (creating the leader key) fails.
func TestNodeRoleCannotSealFlowsStreams(t *testing.T) {
	for _, old := range []bool{false, true} {
		t.Run(map[bool]string{false: "narrowed", true: "control-old-update-rights"}[old], func(t *testing.T) {
			if old {
				withOldNodeUpdates(t)
			}
			s := startAuth(t, User{Name: "nora", Password: "n-secret", Role: "node"})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			own, err := s.Connect()
			if err != nil {
				t.Fatal(err)
			}
			defer own.Close()
			js, _ := jetstream.New(own)
			createFlowStreams(t, ctx, js)
			node, nodeErrs := connectAs(t, s, nats.UserInfo("nora", "n-secret"))
			njs, _ := jetstream.New(node)
			if old {
				st, err := njs.Stream(ctx, "KV_FLOW_LEADER")
				if err != nil {
					t.Fatal(err)
				}
				cfg := st.CachedInfo().Config
				cfg.Sealed = true
				if _, err := njs.UpdateStream(ctx, cfg); err != nil {
					t.Fatalf("control: the old update rights could not seal the leader bucket: %v", err)
				}
				kv, err := njs.KeyValue(ctx, "FLOW_LEADER")
				if err != nil {
					t.Fatal(err)
				}
				_, err = kv.Create(ctx, "leader", []byte("node-a"))
				if err == nil || !strings.Contains(err.Error(), "sealed") {
					t.Fatalf("control: a candidate's create of the leader key on the sealed bucket: %v; want the sealed refusal", err)
				}
				t.Logf("control: sealed by the node; a candidate's create: %v", err)
				return
			}
			for _, name := range client.FlowStreams() {
				st, err := njs.Stream(ctx, name) // reading its info is the node's
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				sealed := st.CachedInfo().Config
				sealed.Sealed = true
				capped := st.CachedInfo().Config
				capped.MaxBytes, capped.DenyPurge = 1, true
				for _, cfg := range []jetstream.StreamConfig{sealed, capped} {
					body, _ := json.Marshal(cfg)
					subject := "$JS.API.STREAM.UPDATE." + name
					if err := node.Publish(subject, body); err != nil {
						t.Fatal(err)
					}
					violation(t, nodeErrs, subject)
				}
				subject := "$JS.API.STREAM.PURGE." + name
				if err := node.Publish(subject, []byte("{}")); err != nil {
					t.Fatal(err)
				}
				if !slices.Contains(client.NodePurges, name) {
					violation(t, nodeErrs, subject)
				}
				if err := node.Publish("$JS.API.STREAM.DELETE."+name, nil); err != nil {
					t.Fatal(err)
				}
				violation(t, nodeErrs, "$JS.API.STREAM.DELETE."+name)
			}
			if err := node.Flush(); err != nil {
				t.Fatal(err)
			}
			for _, name := range client.FlowStreams() {
				st, err := js.Stream(ctx, name)
				if err != nil {
					t.Fatalf("%s after the node's tries: %v", name, err)
				}
				if c := st.CachedInfo().Config; c.Sealed || c.DenyPurge || c.MaxBytes == 1 {
					t.Fatalf("%s after the node's tries: sealed %v, deny purge %v, max bytes %d", name, c.Sealed, c.DenyPurge, c.MaxBytes)
				}
			}
			kv, err := njs.KeyValue(ctx, "FLOW_LEADER")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := kv.Create(ctx, "leader", []byte("node-a")); err != nil {
				t.Fatalf("a candidate's create of the leader key: %v", err)
			}
		})
	}
}

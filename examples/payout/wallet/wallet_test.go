package wallet

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/goleak"
)

type creditFunc func(driver string, cents int, epoch, key string) int

// serve starts a wallet with opts behind an HTTP server and returns a credit function
// and a ledger reader for 2026-11-28.
func serve(t *testing.T, opts ...Option) (creditFunc, func() Ledger) {
	w, err := Open(t.TempDir(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(w.Handler())
	t.Cleanup(func() { srv.Close(); w.Close() })
	credit := func(driver string, cents int, epoch, key string) int {
		body, _ := json.Marshal(map[string]any{"driver": driver, "date": "2026-11-28", "cents": cents})
		req, _ := http.NewRequest("POST", srv.URL+"/credit", bytes.NewReader(body))
		req.Header.Set("Flow-Epoch", epoch)
		req.Header.Set("Idempotency-Key", key)
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	ledger := func() Ledger {
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(srv.URL + "/ledger?date=2026-11-28")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var l Ledger
		if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	return credit, ledger
}

func TestCreditsAreFencedAndIdempotent(t *testing.T) {
	credit, ledger := serve(t)
	if c := credit("d1", 1250, "10", "k1"); c != 200 {
		t.Fatalf("first credit: %d", c)
	}
	if c := credit("d1", 1250, "12", "k1"); c != 200 { // the new owner repeats the item: applied once
		t.Fatalf("repeat: %d", c)
	}
	if c := credit("d1", 1250, "10", "k1"); c != 409 { // the zombie, late, with its old epoch
		t.Fatalf("stale: %d, want 409", c)
	}
	if c := credit("d1", 999, "13", "other"); c != 409 { // another run paying the same driver and day
		t.Fatalf("second payment: %d, want 409", c)
	}
	if c := credit("d2", 500, "12", "k2"); c != 200 {
		t.Fatalf("d2: %d", c)
	}
	if c := credit("", 1, "12", "k3"); c != 400 {
		t.Fatalf("bad credit: %d", c)
	}
	if l := ledger(); l.Drivers != 2 || l.TotalCents != 1750 || l.Rejected != 1 || l.Duplicates != 1 {
		t.Fatalf("ledger %+v", l)
	}
}

// Negative control: the same sequence with the guards off pays d1 three times (the
// first owner, the new owner repeating the unacknowledged item, the zombie's late
// credit): the damage the epoch check and the idempotency key prevent.
func TestWithoutGuardsTheZombiePaysAgain(t *testing.T) {
	credit, ledger := serve(t, WithoutGuards())
	for _, c := range []struct {
		epoch, key string
	}{{"10", "k1"}, {"12", "k1"}, {"10", "k1"}} {
		if code := credit("d1", 1250, c.epoch, c.key); code != 200 {
			t.Fatalf("credit at epoch %s: %d", c.epoch, code)
		}
	}
	if l := ledger(); l.TotalCents != 3*1250 {
		t.Fatalf("without guards d1 got %d cents, want the triple payout %d: the control cannot see the damage", l.TotalCents, 3*1250)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

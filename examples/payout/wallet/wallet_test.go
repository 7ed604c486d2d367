package wallet

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/goleak"
)

func TestCreditsAreFencedAndIdempotent(t *testing.T) {
	w, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	srv := httptest.NewServer(w.Handler())
	defer srv.Close()
	credit := func(driver string, cents int, epoch, key string) int {
		body, _ := json.Marshal(map[string]any{"driver": driver, "date": "2026-11-28", "cents": cents})
		req, _ := http.NewRequest("POST", srv.URL+"/credit", bytes.NewReader(body))
		req.Header.Set("Flow-Epoch", epoch)
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
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
	resp, err := http.Get(srv.URL + "/ledger?date=2026-11-28")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var l Ledger
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		t.Fatal(err)
	}
	if l.Drivers != 2 || l.TotalCents != 1750 || l.Rejected != 1 || l.Duplicates != 1 {
		t.Fatalf("ledger %+v", l)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

package engine

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// keyedWallet is a downstream that de-duplicates by Idempotency-Key as payment APIs do:
// a key seen before is answered as a duplicate and applies nothing, whatever the body.
// Item 2's credit is refused (400) while refuse is set, so that a run fails mid-transfer.
type keyedWallet struct {
	mu      sync.Mutex
	keys    map[string]bool
	applied map[string]int // "date/item" -> credits applied
	refuse  bool
}

func (w *keyedWallet) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	var body struct {
		Date string `json:"date"`
		Item any    `json:"item"`
	}
	_ = json.NewDecoder(r.Body).Decode(&body)
	w.mu.Lock()
	defer w.mu.Unlock()
	key := r.Header.Get("Idempotency-Key")
	item, _ := json.Marshal(body.Item)
	if w.refuse && string(item) == "2" {
		http.Error(rw, "account closed", http.StatusBadRequest)
		return
	}
	if w.keys[key] {
		_, _ = rw.Write([]byte(`{"duplicate":true}`))
		return
	}
	w.keys[key] = true
	w.applied[body.Date+"/"+string(item)]++
	_, _ = rw.Write([]byte(`{"credited":true}`))
}

const requestKeyYAML = `name: pay
inputs:
  date: {type: string}
  url: {type: string}
  items: {type: list, default: [1, 2]}
steps:
  - name: transfer
    uses: http
    foreach: "{{ inputs.items }}"
    parallelism: 1
    with: {method: POST, url: "{{ inputs.url }}", body: {date: "{{ inputs.date }}", item: "{{ item }}", epoch: "{{ run.epoch }}"}}
`

// retryWithAnotherDate: a payout of one date fails mid-transfer (item 2 refused), and
// is retried from the transfer with another date; it returns the wallet.
func retryWithAnotherDate(t *testing.T, h *testhooks.Hooks) *keyedWallet {
	e := startEngineWith(t, h, nil)
	if err := e.Ops().WaitClusterVersion(ctxT(t, 20*time.Second), checkpoint.LogFormatFlowControl); err != nil {
		t.Fatal(err)
	}
	w := &keyedWallet{keys: map[string]bool{}, applied: map[string]int{}, refuse: true}
	srv := httptest.NewServer(w)
	t.Cleanup(srv.Close)
	apply(t, e, requestKeyYAML)
	ctx := ctxT(t, 60*time.Second)
	id, err := e.StartRun(ctx, "pay", map[string]any{"date": "2026-12-01", "url": srv.URL}, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := e.WaitRun(ctx, id); err != nil || r.Status != checkpoint.StatusFailed {
		t.Fatalf("the first payout: %v %v, want failed (item 2 refused)", r, err)
	}
	if r, _ := e.store.Run(id); r.KeyScheme != checkpoint.KeySchemeRequest {
		t.Fatalf("a run submitted at cluster version 3 has key scheme %d", r.KeyScheme)
	}
	w.mu.Lock()
	w.refuse = false
	w.mu.Unlock()
	if err := e.RetryFrom(ctx, id, RetryOptions{From: "transfer", Inputs: map[string]any{"date": "2026-12-02"}}); err != nil {
		t.Fatal(err)
	}
	if r, err := e.WaitRun(ctx, id); err != nil || r.Status != checkpoint.StatusSucceeded {
		t.Fatalf("the retry: %v %v, want succeeded", r, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w
}

// An http step's idempotency key covers its request (issue 39): `retry --from transfer
// --input date=...` pays the other date once, while the paid date's credit is not sent
// again under another key; the epoch in the body changes nothing (left out of the key).
func TestRetryWithAnotherDatePaysItOnce(t *testing.T) {
	w := retryWithAnotherDate(t, nil)
	want := map[string]int{"2026-12-01/1": 1, "2026-12-02/1": 1, "2026-12-02/2": 1}
	if len(w.applied) != len(want) {
		t.Fatalf("credits applied %v, want %v", w.applied, want)
	}
	for k, n := range want {
		if w.applied[k] != n {
			t.Fatalf("credits applied %v, want %v", w.applied, want)
		}
	}
}

// The control: keys of run, step and item only (the scheme before issue 39): the
// retry's credit of item 1 for the other date goes under the paid date's key, and the
// wallet drops it: that driver is never paid for the other date.
func TestRetryWithAnotherDateControlKeySchemeOff(t *testing.T) {
	h := new(testhooks.Hooks)
	h.KeySchemeOff.Store(true)
	w := retryWithAnotherDate(t, h)
	if w.applied["2026-12-02/1"] != 0 || w.applied["2026-12-02/2"] != 1 {
		t.Fatalf("credits applied %v: want the other date's item 1 dropped under the paid date's key", w.applied)
	}
}

// Package wallet is the payout example's ledger: a small HTTP service over Pebble that
// does what the seeds ask of storage downstream of flow. For each (driver, date) it
// remembers the highest epoch it has seen and the idempotency key of the credit it
// applied: a credit carrying a lower epoch is refused (409, and recorded), and a repeated
// idempotency key is applied once. It also serves the ledger's totals.
package wallet

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Credit is one applied credit.
type Credit struct {
	Driver string `json:"driver"`
	Date   string `json:"date"`
	Cents  int64  `json:"cents"`
	Epoch  int64  `json:"epoch"` // the highest epoch seen for this (driver, date)
	Key    string `json:"idempotency_key"`
}

// Rejection is a refused credit.
type Rejection struct {
	Driver, Date string
	Epoch, Seen  int64
	Key          string
}

// Ledger is a date's totals.
type Ledger struct {
	Date       string `json:"date"`
	Drivers    int    `json:"drivers"`
	TotalCents int64  `json:"total_cents"`
	Rejected   int    `json:"rejected_stale"`
	Duplicates int    `json:"duplicates"`
}

// Wallet is the service.
type Wallet struct {
	db       *pebble.DB
	mu       sync.Mutex // one check-and-set at a time (FACTS.md: hold it over Get + Commit(Sync))
	latency  time.Duration
	noGuards bool
	seen     func(driver, traceparent string)
	reused   atomic.Int64 // credits dropped because their key was another credit's
}

// Reused is how many credits were dropped because their idempotency key was another
// credit's (another driver's or another day's).
func (w *Wallet) Reused() int64 { return w.reused.Load() }

// Option configures a Wallet.
type Option func(*Wallet)

// WithLatency makes every credit request take at least d before it is applied, as a
// bank's transfer API would (the chaos demo uses it so that the transfer step lasts
// long enough to be disrupted). Requests wait in parallel, outside the apply lock.
func WithLatency(d time.Duration) Option { return func(w *Wallet) { w.latency = d } }

// WithoutGuards switches the epoch check and the idempotency key off: every credit is
// added to the driver's balance. For negative-control tests only: it shows the double
// payouts the guards prevent.
func WithoutGuards() Option { return func(w *Wallet) { w.noGuards = true } }

// WithCreditSeen calls seen with each credit request's driver and W3C traceparent
// header ("" without one), before it is applied: the run's trace context reaches the
// wallet with every transfer (the payout's tests check it).
func WithCreditSeen(seen func(driver, traceparent string)) Option {
	return func(w *Wallet) { w.seen = seen }
}

// Open opens (or creates) the wallet's database in dir.
func Open(dir string, opts ...Option) (*Wallet, error) {
	db, err := pebble.Open(dir, &pebble.Options{FormatMajorVersion: pebble.FormatValueSeparation, Logger: quiet{}})
	if err != nil {
		return nil, fmt.Errorf("wallet: open %s: %w", dir, err)
	}
	w := &Wallet{db: db}
	for _, o := range opts {
		o(w)
	}
	return w, nil
}

// Close closes the database.
func (w *Wallet) Close() error { return w.db.Close() }

func creditKey(date, driver string) []byte { return []byte("c/" + date + "/" + driver) }

// keyIndex is where the wallet keeps which credit an idempotency key was first used for.
func keyIndex(key string) []byte { return []byte("k/" + key) }

// ErrStale is returned for a credit whose epoch is below the highest seen.
var ErrStale = errors.New("wallet: stale epoch")

// Apply applies a credit: (applied, duplicate, error). A lower epoch than the highest
// seen is ErrStale (and counted); the same idempotency key again is a duplicate.
func (w *Wallet) Apply(driver, date string, cents, epoch int64, key string) (bool, bool, error) {
	if driver == "" || date == "" || key == "" || epoch <= 0 || cents < 0 || strings.Contains(driver+date, "/") {
		return false, false, fmt.Errorf("wallet: a credit needs driver, date, cents >= 0, a Flow-Epoch and an Idempotency-Key")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var cur Credit
	raw, closer, err := w.db.Get(creditKey(date, driver))
	found := err == nil
	if found {
		err = json.Unmarshal(raw, &cur)
		closer.Close()
		if err != nil {
			return false, false, err
		}
	} else if !errors.Is(err, pebble.ErrNotFound) {
		return false, false, err
	}
	// A key the wallet has seen on another credit is that credit's, as payment APIs
	// answer a reused key with the first request's result: the credit is dropped as a
	// duplicate. (So a retry that sent another day's credits under the paid day's keys
	// would leave the drivers unpaid; flow's key covers the request: issue 39.)
	if !w.noGuards {
		if other, closer, err := w.db.Get(keyIndex(key)); err == nil {
			first := string(other)
			closer.Close()
			if first != string(creditKey(date, driver)) {
				w.reused.Add(1)
				return false, true, nil
			}
		} else if !errors.Is(err, pebble.ErrNotFound) {
			return false, false, err
		}
	}
	b := w.db.NewBatch()
	defer b.Close()
	switch {
	case w.noGuards && found: // the damage the guards prevent: a repeated credit pays again
		cur.Cents += cents
		v, _ := json.Marshal(cur)
		_ = b.Set(creditKey(date, driver), v, nil)
		return true, false, b.Commit(pebble.Sync)
	case found && epoch < cur.Epoch:
		_ = b.Set([]byte(fmt.Sprintf("r/%s/%s/%d", date, driver, epoch)), []byte(key), nil)
		if err := b.Commit(pebble.Sync); err != nil {
			return false, false, err
		}
		return false, false, fmt.Errorf("%w: %s on %s: epoch %d < %d", ErrStale, driver, date, epoch, cur.Epoch)
	case found && key == cur.Key:
		cur.Epoch = max(cur.Epoch, epoch)
		v, _ := json.Marshal(cur)
		_ = b.Set(creditKey(date, driver), v, nil)
		_ = b.Set([]byte(fmt.Sprintf("d/%s/%s/%d", date, driver, epoch)), nil, nil)
		return false, true, b.Commit(pebble.Sync)
	case found:
		return false, false, fmt.Errorf("wallet: %s was already paid for %s by another credit (key %s)", driver, date, cur.Key)
	}
	v, _ := json.Marshal(Credit{Driver: driver, Date: date, Cents: cents, Epoch: epoch, Key: key})
	_ = b.Set(creditKey(date, driver), v, nil)
	_ = b.Set(keyIndex(key), creditKey(date, driver), nil)
	return true, false, b.Commit(pebble.Sync)
}

// Totals returns a date's ledger.
func (w *Wallet) Totals(date string) (Ledger, error) {
	l := Ledger{Date: date}
	count := func(prefix string, fn func(v []byte) error) error {
		it, err := w.db.NewIter(&pebble.IterOptions{LowerBound: []byte(prefix), UpperBound: []byte(prefix + "\xff")})
		if err != nil {
			return err
		}
		defer it.Close()
		for ok := it.First(); ok; ok = it.Next() {
			if err := fn(it.Value()); err != nil {
				return err
			}
		}
		return it.Error()
	}
	err := count("c/"+date+"/", func(v []byte) error {
		var c Credit
		if err := json.Unmarshal(v, &c); err != nil {
			return err
		}
		l.Drivers++
		l.TotalCents += c.Cents
		return nil
	})
	if err == nil {
		err = count("r/"+date+"/", func([]byte) error { l.Rejected++; return nil })
	}
	if err == nil {
		err = count("d/"+date+"/", func([]byte) error { l.Duplicates++; return nil })
	}
	return l, err
}

// Handler serves POST /credit and GET /ledger?date=.
func (w *Wallet) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /credit", func(rw http.ResponseWriter, r *http.Request) {
		var body struct {
			Driver string `json:"driver"`
			Date   string `json:"date"`
			Cents  any    `json:"cents"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(rw, "body: "+err.Error(), http.StatusBadRequest)
			return
		}
		cents, err := strconv.ParseInt(strings.TrimSuffix(fmt.Sprint(body.Cents), ".0"), 10, 64)
		if err != nil {
			http.Error(rw, "cents must be a whole number", http.StatusBadRequest)
			return
		}
		epoch, _ := strconv.ParseInt(r.Header.Get("Flow-Epoch"), 10, 64)
		if w.seen != nil {
			w.seen(body.Driver, r.Header.Get("traceparent"))
		}
		if w.latency > 0 {
			t := time.NewTimer(w.latency)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return
			}
		}
		applied, dup, err := w.Apply(body.Driver, body.Date, cents, epoch, r.Header.Get("Idempotency-Key"))
		switch {
		case errors.Is(err, ErrStale):
			http.Error(rw, err.Error(), http.StatusConflict)
		case err != nil && strings.Contains(err.Error(), "already paid"):
			http.Error(rw, err.Error(), http.StatusConflict)
		case err != nil:
			http.Error(rw, err.Error(), http.StatusBadRequest)
		default:
			rw.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(rw).Encode(map[string]any{"driver": body.Driver, "cents": cents, "credited": applied, "duplicate": dup})
		}
	})
	mux.HandleFunc("GET /ledger", func(rw http.ResponseWriter, r *http.Request) {
		l, err := w.Totals(r.URL.Query().Get("date"))
		if err != nil {
			http.Error(rw, err.Error(), http.StatusInternalServerError)
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(l)
	})
	return mux
}

type quiet struct{}

func (quiet) Infof(string, ...any)  {}
func (quiet) Errorf(string, ...any) {}
func (quiet) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf("wallet: pebble: "+format, args...))
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net/http"
	"sort"
	"time"

	"github.com/flowrun/flow/examples/payout/wallet"
	"github.com/flowrun/flow/steps"
)

// The payout's own step kinds, registered on the engine by this program.

// trip is one completed trip.
type trip struct {
	Driver string `json:"driver"`
	Cents  int64  `json:"cents"`
}

// hash mixes FNV-1a's sum with splitmix64's finalizer: FNV alone spreads these short,
// similar keys so badly that hash%5 was 0 for every driver below d0100, and a demo of
// 100 drivers paid nobody.
func hash(parts ...string) uint64 {
	h := fnv.New64a()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// tripsOf is the deterministic data set: the same date always gives the same trips.
func tripsOf(date string, drivers int) []trip {
	var out []trip
	for i := 0; i < drivers; i++ {
		id := fmt.Sprintf("d%04d", i)
		n := int(hash(date, id) % 5)
		for k := 0; k < n; k++ {
			out = append(out, trip{Driver: id, Cents: 500 + int64(hash(date, id, fmt.Sprint(k))%4500)})
		}
	}
	return out
}

func registerSteps(reg *steps.Registry) error {
	collect := steps.Func(func(_ context.Context, in steps.Input) (json.RawMessage, error) {
		date, _ := in.With["date"].(string)
		if _, err := time.Parse("2006-01-02", date); err != nil {
			return nil, steps.Permanentf("collect: date %q is not YYYY-MM-DD", date)
		}
		drivers := int(toFloat(in.With["drivers"]))
		if drivers < 1 || drivers > 100000 {
			return nil, steps.Permanentf("collect: drivers %v: use 1 to 100000", in.With["drivers"])
		}
		return json.Marshal(map[string]any{"date": date, "trips": tripsOf(date, drivers)})
	})
	compute := steps.Func(func(_ context.Context, in steps.Input) (json.RawMessage, error) {
		raw, _ := json.Marshal(in.With["trips"])
		var trips []trip
		if err := json.Unmarshal(raw, &trips); err != nil {
			return nil, steps.Permanentf("compute: trips: %v", err)
		}
		earnings := map[string]int64{}
		for _, t := range trips {
			earnings[t.Driver] += t.Cents // integer cents: no rounding anywhere
		}
		type pay struct {
			ID    string `json:"id"`
			Cents int64  `json:"cents"`
		}
		out := []pay{} // a day nobody is owed anything is an empty list, not null
		var total int64
		for id, c := range earnings {
			out = append(out, pay{id, c})
			total += c
		}
		sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
		above := int64(toFloat(in.With["approval_above"]))
		return json.Marshal(map[string]any{"drivers": out, "count": len(out), "total_cents": total, "needs_approval": total > above})
	})
	report := steps.Func(func(ctx context.Context, in steps.Input) (json.RawMessage, error) {
		url := fmt.Sprintf("%v/ledger?date=%v", in.With["wallet"], in.With["date"])
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, fmt.Errorf("report: %w", err)
		}
		defer resp.Body.Close()
		var l wallet.Ledger
		if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
			return nil, fmt.Errorf("report: ledger: %w", err)
		}
		computed := int64(toFloat(in.With["computed_cents"]))
		if l.TotalCents != computed || l.Drivers != int(toFloat(in.With["drivers"])) {
			return nil, steps.Permanentf("report: the ledger holds %d cents for %d drivers, computed %d cents for %v",
				l.TotalCents, l.Drivers, computed, in.With["drivers"])
		}
		return json.Marshal(map[string]any{"ledger": l, "computed_cents": computed, "match": true})
	})
	for kind, s := range map[string]steps.Step{"payout-collect": collect, "payout-compute": compute, "payout-report": report} {
		if err := reg.Register(kind, s); err != nil {
			return err
		}
	}
	return nil
}

// toFloat reads a number from a step's input (JSON numbers, or Go ints from templates).
func toFloat(v any) float64 {
	switch n := v.(type) {
	case float64:
		return n
	case int:
		return float64(n)
	case int64:
		return float64(n)
	case json.Number:
		f, _ := n.Float64()
		return f
	}
	return 0
}

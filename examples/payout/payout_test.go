package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The demo end to end on 200 drivers: every driver credited once, the ledger total
// equals the computed total (the report step fails the run otherwise).
func TestPayoutDemo(t *testing.T) {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := run(ctx, options{date: "2026-11-28", dataDir: t.TempDir(), walletAddr: "127.0.0.1:0", drivers: 200, out: &out})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	var total int64
	drivers := map[string]bool{}
	for _, tr := range tripsOf("2026-11-28", 200) {
		total += tr.Cents
		drivers[tr.Driver] = true
	}
	for _, line := range []string{": succeeded", fmt.Sprintf("drivers paid:      %d", len(drivers)),
		fmt.Sprintf("total paid:        %d.%02d", total/100, total%100), "fenced commits:    0"} {
		if !strings.Contains(out.String(), line) {
			t.Fatalf("summary lacks %q:\n%s", line, out.String())
		}
	}
}

package checkpointtest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"
)

// Epoch is the time of the first entry RandomLog writes; each later message is a
// millisecond after the one before.
var Epoch = time.Date(2026, 11, 29, 2, 0, 0, 0, time.UTC)

// entry is the log's wire form of an entry (docs/checkpoint.md), written here from the
// document rather than from checkpoint.Entry: the state machine's own tests import this
// package, and a second writer of the format checks that the format is what it says.
type entry struct {
	Kind   string          `json:"k"`
	Run    string          `json:"run,omitempty"`
	Epoch  int64           `json:"epoch,omitempty"`
	Term   int64           `json:"term,omitempty"`
	Owner  string          `json:"owner,omitempty"`
	Step   string          `json:"step,omitempty"`
	Item   int             `json:"item,omitempty"`
	Reason string          `json:"reason,omitempty"`
	Output json.RawMessage `json:"output,omitempty"`
	Items  int             `json:"items,omitempty"`
	Status string          `json:"status,omitempty"`
	Submit *submit         `json:"submit,omitempty"`
	At     time.Time       `json:"at"`
}

type submit struct {
	Workflow  string     `json:"workflow"`
	Version   int        `json:"version"`
	Trigger   string     `json:"trigger"`
	MaxEpochs int        `json:"max_epochs"`
	Steps     []stepSpec `json:"steps"`
}

type stepSpec struct {
	Name    string `json:"name"`
	Foreach bool   `json:"foreach,omitempty"`
}

const itemWhole = -1

// RandomLog makes a deterministic log of n messages (format version 1) over 40 runs of
// three workflows, with zombies' stale epochs, duplicate commits, requeues, retries and
// cancels mixed in, so that many kinds of verdict are applied. Message i is meant for
// sequence i+1: an assign's new epoch is its message's sequence.
func RandomLog(seed uint64, n int) [][]byte {
	rng := rand.New(rand.NewPCG(seed, seed))
	epochs := map[string]int64{} // the runs submitted, with the epoch last assigned
	var msgs [][]byte
	for seq := int64(1); len(msgs) < n; seq++ {
		k := 1 + rng.IntN(6)
		var entries []entry
		for i := 0; i < k; i++ {
			id := fmt.Sprintf("run-%d", rng.IntN(40))
			current, known := epochs[id]
			var e entry
			switch {
			case !known:
				e = entry{Kind: "submit", Run: id, Submit: &submit{
					Workflow: fmt.Sprintf("wf%d", len(epochs)%3), // three workflows, for the admission queue's lines
					Version:  1, Trigger: "manual", MaxEpochs: 3,
					Steps: []stepSpec{{Name: "a"}, {Name: "b", Foreach: true}, {Name: "c"}},
				}}
				epochs[id] = 0
			default:
				epoch := current
				if rng.IntN(5) == 0 && epoch > 3 {
					epoch -= int64(1 + rng.IntN(3)) // a zombie's stale epoch
				}
				switch rng.IntN(8) {
				case 0:
					e = entry{Kind: "assign", Run: id, Epoch: current, Term: int64(1 + rng.IntN(3)), Reason: "lease-expired"}
					if i == 0 { // only a message's first entry is sure to assign at seq
						epochs[id] = seq
					}
				case 1:
					e = entry{Kind: "claim", Run: id, Epoch: epoch, Owner: fmt.Sprintf("w%d", rng.IntN(3))}
				case 2:
					e = entry{Kind: "start", Run: id, Epoch: epoch, Owner: "w", Step: []string{"a", "b", "c"}[rng.IntN(3)], Item: itemWhole, Items: 5}
				case 3, 4, 5:
					step, item := "b", rng.IntN(5)
					if rng.IntN(2) == 0 {
						step, item = []string{"a", "c"}[rng.IntN(2)], itemWhole
					}
					e = entry{Kind: "commit", Run: id, Epoch: epoch, Owner: "w", Step: step, Item: item, Output: json.RawMessage(fmt.Sprintf(`{"n":%d}`, rng.IntN(1000)))}
				case 6:
					e = entry{Kind: "complete", Run: id, Epoch: epoch, Owner: "w", Status: "succeeded"}
				case 7:
					e = entry{Kind: []string{"requeue", "retry", "cancel"}[rng.IntN(3)], Run: id, Epoch: epoch, Owner: "w"}
				}
			}
			e.At = Epoch.Add(time.Duration(seq) * time.Millisecond)
			entries = append(entries, e)
		}
		data, err := json.Marshal(struct {
			V       int     `json:"v"`
			Node    string  `json:"node"`
			Entries []entry `json:"entries"`
		}{1, "gen", entries})
		if err != nil {
			panic(err) // only strings, numbers and times: cannot fail
		}
		msgs = append(msgs, data)
	}
	return msgs
}

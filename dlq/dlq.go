package dlq

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/base/streams"
)

// Stream and subjects.
const (
	Stream        = "FLOW_DLQ"
	SubjectPrefix = "flow.dlq."
	dedupWindow   = 24 * time.Hour
)

// Message is what a DLQ subscriber receives.
type Message struct {
	Run          string `json:"run"`
	Workflow     string `json:"workflow"`
	Epoch        int64  `json:"epoch"`
	EpochChanges int    `json:"epoch_changes"`
	MaxEpochs    int    `json:"max_epochs"`
	Reason       string `json:"reason"`
	LastOwner    string `json:"last_owner,omitempty"`
	At           string `json:"at"`
}

// StreamConfig is the stream as Open creates it.
func StreamConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        Stream,
		Description: "flow dead-letter notices: runs past max_epochs",
		Subjects:    []string{SubjectPrefix + ">"},
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
		Duplicates:  dedupWindow,
		MaxAge:      30 * 24 * time.Hour,
	}
}

// Open creates the stream if needed.
func Open(ctx context.Context, js jetstream.JetStream, replicas int) error {
	_, err := streams.EnsureStream(ctx, js, StreamConfig(replicas))
	if err != nil {
		return fmt.Errorf("dlq: stream %s: %w", Stream, err)
	}
	return nil
}

// Publish announces a dead-lettered run. Publishing the same run and epoch again is a
// duplicate the stream drops, so the leader can publish at every reconcile.
func Publish(ctx context.Context, js jetstream.JetStream, m Message) error {
	data, _ := json.Marshal(m)
	_, err := js.Publish(ctx, SubjectPrefix+m.Run, data, jetstream.WithMsgID(m.Run+"@"+strconv.FormatInt(m.Epoch, 10)))
	if err != nil {
		return fmt.Errorf("dlq: publish %s: %w", m.Run, err)
	}
	return nil
}

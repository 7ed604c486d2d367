package dlq

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/flowrun/flow/internal/base/port"
)

// Stream and subjects.
const (
	Stream        = port.DLQStream
	SubjectPrefix = port.DLQSubject
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

// Publish announces a dead-lettered run. Publishing the same run and epoch again is a
// duplicate the stream drops, so the leader can publish at every reconcile.
func Publish(ctx context.Context, p port.Publisher, m Message) error {
	data, _ := json.Marshal(m)
	err := p.Publish(ctx, SubjectPrefix+m.Run, m.Run+"@"+strconv.FormatInt(m.Epoch, 10), data)
	if err != nil {
		return fmt.Errorf("dlq: publish %s: %w", m.Run, err)
	}
	return nil
}

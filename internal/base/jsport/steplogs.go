package jsport

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/base/port"
)

// StepLogs is a port.StepLogs on JetStream: a run's messages are on its subject of
// FLOW_STEPLOGS, read with a get by subject and removed with a purge by subject.
type StepLogs struct {
	js jetstream.JetStream
}

var _ port.StepLogs = (*StepLogs)(nil)

// OpenStepLogs opens (creating it if missing) the step logs' stream.
func OpenStepLogs(ctx context.Context, js jetstream.JetStream, replicas int) (*StepLogs, error) {
	if _, err := EnsureStream(ctx, js, StepLogsConfig(replicas)); err != nil {
		return nil, mapErr(err)
	}
	return &StepLogs{js: js}, nil
}

// Append implements port.StepLogs.
func (s *StepLogs) Append(ctx context.Context, run, msgID string, data []byte) error {
	_, err := s.js.Publish(ctx, port.StepLogSubject+port.StepLogToken(run), data, jetstream.WithMsgID(msgID))
	return mapErr(err)
}

// Next implements port.StepLogs.
func (s *StepLogs) Next(ctx context.Context, run string, after uint64) (port.Message, bool, error) {
	st, err := s.js.Stream(ctx, port.StepLogStream)
	if err != nil {
		return port.Message{}, false, mapErr(err)
	}
	m, err := st.GetMsg(ctx, after+1, jetstream.WithGetMsgSubject(port.StepLogSubject+port.StepLogToken(run)))
	if err != nil {
		if err = mapErr(err); isNotFound(err) {
			return port.Message{}, false, nil
		}
		return port.Message{}, false, err
	}
	return port.Message{Seq: m.Sequence, ID: m.Header.Get(jetstream.MsgIDHeader), Data: m.Data}, true, nil
}

// Remove implements port.StepLogs.
func (s *StepLogs) Remove(ctx context.Context, run string) error {
	st, err := s.js.Stream(ctx, port.StepLogStream)
	if err != nil {
		return mapErr(err)
	}
	return mapErr(st.Purge(ctx, jetstream.WithPurgeSubject(port.StepLogSubject+port.StepLogToken(run))))
}

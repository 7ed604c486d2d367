package jsport

import (
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"
)

// SyncPolicy is what a NATS server says of its JetStream durability.
type SyncPolicy int

const (
	// SyncUnknown: the server did not say. Its monitoring requests ($SYS.REQ.SERVER.*)
	// answer only connections of the system account, so an ordinary user cannot ask.
	SyncUnknown SyncPolicy = iota
	// SyncEveryWrite: the server fsyncs every write (sync_interval: always).
	SyncEveryWrite
	// SyncPeriodic: the server fsyncs on a timer (its default, every 2 minutes), so an
	// acknowledged write can be lost on a power cut.
	SyncPeriodic
)

// ServerSyncPolicy asks the server nc is connected to whether its JetStream fsyncs every
// write, waiting at most timeout for an answer.
func ServerSyncPolicy(nc *nats.Conn, timeout time.Duration) SyncPolicy {
	id := nc.ConnectedServerId()
	if id == "" {
		return SyncUnknown
	}
	msg, err := nc.Request("$SYS.REQ.SERVER."+id+".VARZ", nil, timeout)
	if err != nil {
		return SyncUnknown
	}
	var resp struct {
		Data *struct {
			JetStream struct {
				Config *struct {
					SyncAlways bool `json:"sync_always"`
				} `json:"config"`
			} `json:"jetstream"`
		} `json:"data"`
	}
	if json.Unmarshal(msg.Data, &resp) != nil || resp.Data == nil || resp.Data.JetStream.Config == nil {
		return SyncUnknown
	}
	if resp.Data.JetStream.Config.SyncAlways {
		return SyncEveryWrite
	}
	return SyncPeriodic
}

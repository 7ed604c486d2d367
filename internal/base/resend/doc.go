// Package resend is what lets the API client send a write again when its first try
// went unanswered, without starting a run twice.
//
// A NATS request to the API's queue group can vanish: the server may hand it to a node
// that is dying (SIGKILLed, partitioned) before its subscription is gone, and nothing
// answers or redelivers it. Reads are simply sent again. A start is sent again too, made
// safe by two things carried here:
//
//   - Its run ID is fixed before the first try. Without an ID the client derives one
//     from a random nonce (RunIDFor): the same shape as a node's generated IDs, and a
//     node that is given the nonce in the request's header (HeaderNonce) can check that
//     the ID is the nonce's (Derived) and so treat it as new (the leader's short path),
//     as it would an ID it made itself.
//   - A try after the first says so (HeaderTry). A node that finds the run already
//     there answers such a try with the run's ID when the run is this start's (the
//     same workflow, inputs, trigger and starter): the first try got through and only
//     its answer was lost. A first try, or a run that differs, is the conflict it
//     always was.
//
// Both ride in headers, not in the request's JSON (which servers decode strictly): a
// node of an older release ignores them and sees a start with a given ID, which it
// never starts twice either.
package resend

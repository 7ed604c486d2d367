// Package bytelimit bounds the bytes each key (a person, on a node) may spend a second,
// in bursts: the API's large requests and the engine's signal data. A key
// unused for a minute is forgotten (its allowance would be full again anyway).
package bytelimit

package testkit

import "time"

// Paced calls do with 0 to n-1 at rate calls a second from now, as a
// benchmark's load runs at a fixed rate, and stops at the first error.
func Paced(n int, rate float64, do func(i int) error) error {
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))); d > 0 {
			time.Sleep(d) // the pace itself
		}
		if err := do(i); err != nil {
			return err
		}
	}
	return nil
}

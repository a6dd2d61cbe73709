package codebox

import (
	"context"
	"testing"
	"time"
)

// TestTimeoutRaceIsNotAnInterruption: with a timeout so short that the
// timer fires around the moment a quick cell finishes, a cell either was
// interrupted (KeyboardInterrupt, TimedOut) or ran to completion (its
// output, no error, not TimedOut) — never full output flagged as timed
// out, which 'airlock ask' printed with a note that the code was
// interrupted.
func TestTimeoutRaceIsNotAnInterruption(t *testing.T) {
	x := hostContext(t, time.Millisecond, 2*time.Second)
	completed, interrupted := 0, 0
	for i := 0; i < 30; i++ {
		res, err := x.Run(context.Background(), "print('done')")
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case res.Error != nil && res.Error.Name == "KeyboardInterrupt":
			if !res.TimedOut {
				t.Fatalf("interrupted cell not TimedOut: %+v", res)
			}
			interrupted++
		case res.Error == nil && res.Stdout == "done\n":
			if res.TimedOut {
				t.Fatalf("a cell that ran to completion is reported as timed out: %+v", res)
			}
			completed++
		default:
			t.Fatalf("unexpected result %+v (error %+v)", res, res.Error)
		}
	}
	t.Logf("%d completed, %d interrupted", completed, interrupted)
}

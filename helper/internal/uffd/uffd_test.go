package uffd

import "testing"

// The probe faults every page and measures a cost (here, on CI's host too).
func TestFaultCost(t *testing.T) {
	d, err := FaultCost(2000)
	if err != nil {
		t.Skipf("userfaultfd not usable here: %v", err)
	}
	if d <= 0 {
		t.Fatalf("a fault took %v", d)
	}
	t.Logf("a userfaultfd fault round trip: %v", d)
}

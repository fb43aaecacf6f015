// Package units writes quantities for people: byte counts in binary units.
package units

import "fmt"

// Bytes writes n in binary units; exact bytes below 1 KiB.
func Bytes(n uint64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v, exp := float64(n)/1024, 0
	for v >= 1024 && exp < 5 {
		v /= 1024
		exp++
	}
	if v == float64(uint64(v)) {
		return fmt.Sprintf("%d %ciB", uint64(v), "KMGTPE"[exp])
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTPE"[exp])
}

package ptx

import (
	"testing"

	"github.com/gpucr/gpucr/internal/testroot"
)

// WriteSets of the images an application loads: PTX text, and a fat
// binary carrying the same PTX twice (two architectures) beside SASS.
// heartbeat's kernels write through their first parameter only (app_hb_mix
// reads its second); ptrchase's write through pointers loaded from memory
// and are undecided (app_pc_step reads through them too); an ELF image says nothing.
func TestWriteSets(t *testing.T) {
	root := testroot.Dir(t)
	hb := cString(t, appSource(root, "heartbeat"))
	pc := cString(t, appSource(root, "ptrchase"))
	fat := fatbinContainer(
		fatbinEntry(FatbinELF, 90, []byte("\x7fELF not really"), 0, 0, 64),
		fatbinEntry(FatbinPTX, 90, []byte(hb+"\x00"), 0, 0, 64),
		fatbinEntry(FatbinPTX, 80, []byte(hb+"\x00"), 0, 0, 64),
	)
	for name, image := range map[string][]byte{"text": []byte("\n" + hb + "\x00trailing"), "fatbin": fat} {
		ws, err := WriteSets(image)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for k, want := range map[string]WriteSet{
			"app_hb_init": {Written: 1, Decided: true, ReadsDecided: true},
			"app_hb_step": {Written: 1, Decided: true, ReadsDecided: true},
			"app_hb_mix":  {Written: 1, Decided: true, ReadsDecided: true},
		} {
			if ws[k] != want {
				t.Errorf("%s: %s: %+v, want %+v", name, k, ws[k], want)
			}
		}
	}
	ws, err := WriteSets([]byte(pc))
	if err != nil {
		t.Fatal(err)
	}
	if w, ok := ws["app_pc_step"]; !ok || w.Decided || w.ReadsDecided {
		t.Errorf("ptrchase's app_pc_step: %+v (found %v), want undecided, reads too", w, ok)
	}
	if ws, err := WriteSets([]byte("\x7fELF\x02\x01\x01")); err != nil || len(ws) != 0 {
		t.Errorf("an ELF image: %v, %v; want nothing", ws, err)
	}
}

// Package inventory describes the host's GPUs for the helper and the CLI:
// names, UUIDs, memory and driver version. NVML (github.com/NVIDIA/go-nvml)
// is asked first; where it is missing (hosts without libnvidia-ml.so.1, the
// simulated driver) the report comes from the driver API alone, with a note.
package inventory

import (
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpucr/gpucr/helper/cuda"
)

// Device is one GPU.
type Device struct {
	Ordinal     int    `json:"ordinal"`
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	TotalMemory uint64 `json:"total_memory"`
	Granularity uint64 `json:"granularity,omitempty"`
}

// Inventory is what the host has.
type Inventory struct {
	// DriverVersion: NVML's ("580.65.06") when NVML answers, else the
	// driver API's CUDA version ("13.0").
	DriverVersion string   `json:"driver_version,omitempty"`
	Source        string   `json:"source"` // "nvml+driver", "driver" or "none"
	Devices       []Device `json:"devices"`
	Notes         []string `json:"notes,omitempty"`
}

// nvmlInfo is what NVML said, by UUID.
type nvmlInfo struct {
	driver  string
	devices map[string]Device
}

var nvmlMu sync.Mutex

// queryNVML asks NVML; any failure, a missing library included, is an error,
// never a crash.
func queryNVML() (info *nvmlInfo, err error) {
	nvmlMu.Lock()
	defer nvmlMu.Unlock()
	defer func() {
		if r := recover(); r != nil {
			info, err = nil, fmt.Errorf("NVML: %v", r)
		}
	}()
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML unavailable: %s", nvml.ErrorString(ret))
	}
	defer func() { _ = nvml.Shutdown() }()
	info = &nvmlInfo{devices: map[string]Device{}}
	if v, ret := nvml.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		info.driver = v
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML: nvmlDeviceGetCount: %s", nvml.ErrorString(ret))
	}
	for i := 0; i < n; i++ {
		d, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		var dev Device
		dev.Ordinal = i
		if s, ret := d.GetUUID(); ret == nvml.SUCCESS {
			dev.UUID = s
		}
		if s, ret := d.GetName(); ret == nvml.SUCCESS {
			dev.Name = s
		}
		if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			dev.TotalMemory = m.Total
		}
		if dev.UUID != "" {
			info.devices[dev.UUID] = dev
		}
	}
	return info, nil
}

// Collect builds the inventory from the loaded driver (nil if it could not be
// loaded; loadErr then says why) and NVML if present. Devices are the
// driver's (ordinals as the helper sees them); NVML supplies the driver
// version and fills names it knows better.
func Collect(drv *cuda.Driver, loadErr error) Inventory {
	inv := Inventory{Source: "none", Devices: []Device{}}
	nv, nvErr := queryNVML()
	if drv != nil {
		inv.Source = "driver"
		inv.DriverVersion = fmt.Sprintf("CUDA %d.%d", drv.Version/1000, drv.Version%1000/10)
		for _, d := range drv.Devices {
			inv.Devices = append(inv.Devices, Device{Ordinal: d.Ordinal, UUID: d.UUID, Name: d.Name,
				TotalMemory: d.TotalMemory, Granularity: d.Granularity})
		}
	} else if loadErr != nil {
		inv.Notes = append(inv.Notes, "driver: "+loadErr.Error())
	}
	if nvErr != nil {
		inv.Notes = append(inv.Notes, nvErr.Error()+"; devices reported from the driver API only")
		return inv
	}
	if nv.driver != "" {
		inv.DriverVersion = nv.driver
	}
	if drv == nil {
		inv.Source = "nvml"
		for _, d := range nv.devices {
			inv.Devices = append(inv.Devices, d)
		}
		return inv
	}
	inv.Source = "nvml+driver"
	for i := range inv.Devices {
		if d, ok := nv.devices[inv.Devices[i].UUID]; ok && d.Name != "" {
			inv.Devices[i].Name = d.Name
		}
	}
	return inv
}

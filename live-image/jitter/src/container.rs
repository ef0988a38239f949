//! `jitter --container IMAGE`: after the host measurement, and under the
//! same load, cyclictest again inside one RT container per RT CPU, started
//! with the options `emberrtos-rt-run` uses (`rtreport::container`), so the
//! report can say what a container adds to the host's worst case.

use std::fs::File;
use std::process::Command;

use anyhow::{Context, Result, anyhow};
use rtreport::container::{self, ListFailure, Refusal};
use rtreport::report::{Assessment, ContainerSection, CoreStats, Difference};

use crate::cpus::CpuSet;
use crate::cyclictest::{self, RunParams, ThreadResult, run_tool_to_end};
use crate::process::{MissingTool, hint_privileges};

#[derive(Clone, Debug)]
pub struct ContainerOptions {
    /// An image in podman's local store that holds cyclictest.
    pub image: String,
    /// `--container-budget`: the most latency the container may add, in µs.
    pub budget_us: u64,
}

/// The RT CPUs, held for the measurement: their locks (the ones
/// `emberrtos-rt-run` takes), with no RT container on any of them.
pub struct Claim {
    _locks: Vec<File>,
}

/// Takes every RT CPU's lock and checks that no RT container holds one.
pub fn claim(rt_cpus: &CpuSet) -> Result<Claim> {
    let mut locks = Vec::new();
    for cpu in rt_cpus.iter() {
        let lock = container::lock_cpu(cpu)
            .with_context(|| format!("taking {}", container::lock_path(cpu).display()))?
            .ok_or(Refusal::Locked { cpu })?;
        locks.push(lock);
    }
    let listed = container::list_rt_containers().map_err(|failure| match failure {
        ListFailure::Spawn(e) if e.kind() == std::io::ErrorKind::NotFound => anyhow!(podman_tool()),
        failure => anyhow!(failure).context("listing the RT containers"),
    })?;
    for cpu in rt_cpus.iter() {
        container::check_free(cpu, &listed)?;
    }
    Ok(Claim { _locks: locks })
}

fn podman_tool() -> MissingTool {
    MissingTool {
        program: "podman".into(),
        package: "podman".into(),
        note: " (--container runs rootful podman)".into(),
    }
}

/// The set holding `cpu` alone.
fn just(cpu: u32) -> CpuSet {
    CpuSet::parse(&cpu.to_string()).expect("a CPU number is a CPU list")
}

/// The podman command line for the container on `cpu`: the RT profile, the
/// image, and cyclictest measuring that CPU alone (its main thread too: the
/// container has no other CPU).
pub fn command_line(image: &str, params: &RunParams, cpu: u32) -> Vec<String> {
    let only = just(cpu);
    let one_cpu = RunParams {
        rt_cpus: only.clone(),
        housekeeping: only,
        ..params.clone()
    };
    let mut args: Vec<String> = ["podman", "run", "--rm", "--pull", "never"]
        .map(String::from)
        .to_vec();
    args.extend(container::profile_args(cpu));
    args.push(image.to_string());
    args.push("cyclictest".into());
    args.extend(cyclictest::arguments(&one_cpu, None));
    args
}

/// Measures every RT CPU in its own container at once; their threads in
/// CPU order, and the command lines.
pub fn measure(
    options: &ContainerOptions,
    params: &RunParams,
) -> Result<(Vec<ThreadResult>, Vec<Vec<String>>)> {
    let commands: Vec<Vec<String>> = params
        .rt_cpus
        .iter()
        .map(|cpu| command_line(&options.image, params, cpu))
        .collect();
    eprintln!(
        "jitter: measuring CPUs {} in containers of {} for {} s",
        params.rt_cpus, options.image, params.duration_s
    );
    let results: Vec<Result<Vec<ThreadResult>>> = std::thread::scope(|scope| {
        let runs: Vec<_> = params
            .rt_cpus
            .iter()
            .zip(&commands)
            .map(|(cpu, command)| scope.spawn(move || measure_one(command, cpu, &params.housekeeping)))
            .collect();
        runs.into_iter()
            .map(|run| {
                run.join()
                    .unwrap_or_else(|_| Err(anyhow!("a container measurement panicked")))
            })
            .collect()
    });
    let mut threads = Vec::new();
    for result in results {
        threads.extend(result?);
    }
    Ok((threads, commands))
}

fn measure_one(command: &[String], cpu: u32, housekeeping: &CpuSet) -> Result<Vec<ThreadResult>> {
    let stdout = run_tool_to_end(
        Command::new(&command[0]).args(&command[1..]),
        podman_tool(),
        housekeeping,
    )
    .map_err(hint_privileges)
    .with_context(|| format!("measuring CPU {cpu} in a container"))?;
    let text = cyclictest::parse_histogram(&stdout)
        .with_context(|| format!("parsing the histogram cyclictest printed in the container on CPU {cpu}"))?;
    let only = just(cpu);
    Ok(cyclictest::combine(text, None, &only))
}

/// The report's section: the container's figures, their assessment, and
/// the difference to the host's.
pub fn section(
    options: &ContainerOptions,
    commands: Vec<Vec<String>>,
    threads: &[ThreadResult],
    assessment: Assessment,
    host: &Assessment,
) -> ContainerSection {
    let difference = Difference::of(host, &assessment, options.budget_us);
    ContainerSection {
        image: options.image.clone(),
        commands,
        cores: threads.iter().map(CoreStats::from).collect(),
        assessment,
        difference,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_container_measures_its_one_cpu_with_the_rt_profile() {
        let params = RunParams {
            duration_s: 10,
            interval_us: 200,
            priority: 99,
            rt_cpus: CpuSet::parse("1-2").unwrap(),
            housekeeping: CpuSet::parse("0").unwrap(),
            histogram_max_us: 1000,
        };
        let line = command_line("localhost/rt-test", &params, 2).join(" ");
        let profile = container::profile_args(2).join(" ");
        assert_eq!(
            line,
            format!(
                "podman run --rm --pull never {profile} localhost/rt-test cyclictest -m -q -p99 -i200 -d0 -D10 -a2 -t1 --mainaffinity=2 -h1000"
            )
        );
    }
}

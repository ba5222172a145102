"""Fluid's fit-a-line program: a linear regression, as Fluid 1.x's documentation writes it.

Besides the import, only ``--help``, a progress bar on stderr, ``--plot FILE.png`` (the loss
curve) and the programs' fixed ``random_seed`` (every run starts from the same parameters and
prints the same numbers) differ from Fluid's: define the network,
minimise the mean squared error with SGD, initialise the parameters with the startup program,
then train and print the predictions and the mean cost (shape [1], as in Fluid 1.x). The
loss decreases over the steps.
"""
import argparse

from _training import Progress, add_plot_argument, check_plot_path, save_plot

# --help answers here, before numpy and pdjit are imported
ap = argparse.ArgumentParser(description=__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
add_plot_argument(ap)
args = ap.parse_args()
if args.plot:
    check_plot_path(ap, args.plot)  # before any training

import numpy  # noqa: E402

import pdjit as fluid  # noqa: E402

# Fixed seeds for the programs' random ops (the parameters' initialisers): every run starts from
# the same parameters and prints the same numbers
fluid.default_startup_program().random_seed = 90
fluid.default_main_program().random_seed = 90
# Define data
train_data = numpy.array([[1.0], [2.0], [3.0], [4.0]]).astype('float32')
y_true = numpy.array([[2.0], [4.0], [6.0], [8.0]]).astype('float32')
# Define the network
x = fluid.layers.data(name="x", shape=[1], dtype='float32')
y = fluid.layers.data(name="y", shape=[1], dtype='float32')
y_predict = fluid.layers.fc(input=x, size=1, act=None)
# definition loss function
cost = fluid.layers.square_error_cost(input=y_predict, label=y)
avg_cost = fluid.layers.mean(cost)
# defined optimization method
sgd_optimizer = fluid.optimizer.SGD(learning_rate=0.01)
sgd_optimizer.minimize(avg_cost)

# Execute training on CPU
cpu = fluid.CPUPlace()
exe = fluid.Executor(cpu)
# Parameter initialization
exe.run(fluid.default_startup_program())
progress = Progress(100, "fit a line")  # a progress bar on stderr (tqdm when installed)
for step in range(100):
    outs = exe.run(
        feed={'x': train_data, 'y': y_true},
        fetch_list=[y_predict.name, avg_cost.name])
    progress.step(outs[1][0])
    if step % 20 == 0 or step == 99:
        print(f"step {step:3d}  mean cost {float(outs[1][0]):.6f}")
progress.close()
print(outs)
if args.plot:
    save_plot(args.plot, [progress], "Linear regression (fit a line), SGD")

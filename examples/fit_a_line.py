"""The seed's fit-a-line program (design principles of Fluid, section "Code Instance").

The network, run forward: data -> fc -> square_error_cost -> mean, with parameters initialised
by the startup program. Only the import differs from the seed.
"""
import numpy

import pdjit as fluid

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

# Execute on CPU
cpu = fluid.CPUPlace()
exe = fluid.Executor(cpu)
# Parameter initialization
exe.run(fluid.default_startup_program())
outs = exe.run(
    feed={'x': train_data, 'y': y_true},
    fetch_list=[y_predict.name, avg_cost.name])
print(outs)
